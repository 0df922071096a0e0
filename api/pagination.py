"""The `limit` and `after` query parameters of every paginated list (registry/pages.py does the keyset reads)
and OpenAI's list envelope around a page: {"object": "list", "data", "first_id", "last_id", "has_more"}.

`limit` is read as text so that a bad value is a 400 saying the range (FastAPI's own check answers 422 with
pydantic's words); `after` is the `last_id` of the previous page."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, Query

from api.errors import ApiError
from api.schemas import PageResponse
from registry.pages import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, PageRequest

LIMIT_RULE = f"limit must be an integer from 1 to {MAX_PAGE_SIZE} (default {DEFAULT_PAGE_SIZE})"
LIMIT_DOC = f"How many items per page: 1 to {MAX_PAGE_SIZE}, default {DEFAULT_PAGE_SIZE}."
AFTER_DOC = "The `last_id` of the previous page: this page starts after that item (left out: the first page)."


def parse_limit(value: str | None) -> int:
    """The page size of a `limit` query value; 400 naming the range when it is not an integer in it."""
    if value is None or value == "":
        return DEFAULT_PAGE_SIZE
    if not value.isascii() or not value.isdigit() or not 1 <= int(value) <= MAX_PAGE_SIZE:
        raise ApiError(400, "invalid_request", f"{LIMIT_RULE}, got {value[:40]!r}", param="limit")
    return int(value)


async def page_request(
    limit: Annotated[str | None, Query(description=LIMIT_DOC, examples=[str(DEFAULT_PAGE_SIZE)])] = None,
    after: Annotated[str | None, Query(description=AFTER_DOC)] = None,
) -> PageRequest:
    """The page a list request asks for (400 for a bad limit or a malformed cursor)."""
    return PageRequest(limit=parse_limit(limit), after=after or None)


PageDep = Annotated[PageRequest, Depends(page_request)]


def page_response(
    data: list[Any], has_more: bool, id_of: Callable[[Any], str] = lambda item: item.id
) -> PageResponse:
    """The list envelope of one page (`id_of`: an item's id, by default its `id`)."""
    if not data:
        return PageResponse(data=[], has_more=has_more)
    return PageResponse(data=data, first_id=id_of(data[0]), last_id=id_of(data[-1]), has_more=has_more)
