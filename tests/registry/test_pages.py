"""The page request's checks (registry/pages.py); the keyset reads are tested through each list's module."""

from __future__ import annotations

import pytest

from registry.errors import InvalidRequestError
from registry.pages import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, InvalidCursorError, PageRequest, split_page


@pytest.mark.parametrize("limit", [0, -1, MAX_PAGE_SIZE + 1])
def test_a_limit_outside_the_range_is_refused_naming_it(limit: int) -> None:
    with pytest.raises(InvalidRequestError, match=f"from 1 to {MAX_PAGE_SIZE}"):
        PageRequest(limit=limit)


@pytest.mark.parametrize("after", ["", "a\x00b", "line\nbreak", "x" * 257])
def test_a_cursor_with_control_characters_or_too_long_is_invalid(after: str) -> None:
    with pytest.raises(InvalidCursorError, match="last_id of the previous page"):
        PageRequest(after=after)


def test_defaults_and_the_extra_row_says_more_follow() -> None:
    assert PageRequest() == PageRequest(limit=DEFAULT_PAGE_SIZE, after=None)
    assert split_page([1, 2, 3], 2).items == [1, 2] and split_page([1, 2, 3], 2).has_more
    assert split_page([1, 2], 2).items == [1, 2] and not split_page([1, 2], 2).has_more
