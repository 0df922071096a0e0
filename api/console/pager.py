"""The console's list pages a page at a time, as the REST lists do (registry/pages.py): the `after` query value
of a page and the links to the first and the next page (templates/macros.html `pager`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from registry.pages import Page, PageRequest


def console_page_request(after: str | None) -> PageRequest:
    """The page a console list shows: the default size, after the row `after` (a bad one: the error page)."""
    return PageRequest(after=after or None)


def pager(
    page: Page[Any], request: PageRequest, id_of: Callable[[Any], str] = lambda row: row.id
) -> dict[str, Any]:
    """The template values of the page's links: `next_after` (None on the last page) and `is_first_page`."""
    next_after = id_of(page.items[-1]) if page.has_more and page.items else None
    return {"next_after": next_after, "is_first_page": request.after is None}
