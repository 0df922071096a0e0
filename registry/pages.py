"""Keyset (cursor) pagination of the registry's lists: one page is the rows after a position in a stable
unique order, read with `WHERE (k1, k2, ...) > (:v1, :v2, ...) ORDER BY k1, k2, ... LIMIT n + 1`, so a
page costs the same on the first and on the ten-thousandth page (an index on the keys serves it; never
OFFSET). The extra row says whether there is a next page.

A position comes from the id of the last row of the previous page (`after`, OpenAI's list cursor): the row
is looked up inside the caller's scope (a tenant's own rows), and an id outside it, another tenant's
included, is the same InvalidCursorError as an id that does not exist, so a cursor tells nothing about
rows the caller cannot list. Rows inserted between pages after the position show up on a later page;
rows before it do not; no row is ever shown twice.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import ColumnElement, Select, bindparam, select, tuple_
from sqlalchemy.orm import Session

from registry.errors import InvalidRequestError

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
MAX_CURSOR_CHARS = 256
# printable (PostgreSQL text cannot hold NUL at all) and short: every id of a list fits
CURSOR_RE = re.compile(rf"[^\x00-\x1f\x7f]{{1,{MAX_CURSOR_CHARS}}}")

T = TypeVar("T")


class InvalidCursorError(InvalidRequestError):
    """`after` names no row of this list (never says whether the row exists elsewhere)."""

    code = "invalid_cursor"


@dataclass(frozen=True)
class PageRequest:
    """At most `limit` rows after the row whose id is `after` (None: from the first row)."""

    limit: int = DEFAULT_PAGE_SIZE
    after: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.limit <= MAX_PAGE_SIZE:
            raise InvalidRequestError(
                f"limit must be an integer from 1 to {MAX_PAGE_SIZE}, got {self.limit}", code="invalid_limit"
            )
        if self.after is not None and not CURSOR_RE.fullmatch(self.after):
            raise invalid_cursor(self.after)


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list: its rows in list order and whether more follow."""

    items: list[T]
    has_more: bool


def invalid_cursor(after: str) -> InvalidCursorError:
    """The one error of a cursor that names no row of the list (the same whatever the reason)."""
    shown = after[:80] + ("..." if len(after) > 80 else "")
    return InvalidCursorError(
        f"after={shown!r} is not the id of an item of this list: pass the last_id of the previous page, or "
        "leave `after` out to start from the first page"
    )


def anchor_key(
    session: Session,
    page: PageRequest,
    keys: Sequence[Any],
    id_column: Any,
    scope: Sequence[ColumnElement[bool]],
) -> tuple[Any, ...] | None:
    """The sort key (the values of `keys`) of the page's cursor row: the row whose `id_column` is
    `page.after` among the rows matching `scope` (the list's own rows: the caller's tenant, the adapter...).
    None without a cursor; InvalidCursorError when no row of the scope has that id."""
    if page.after is None:
        return None
    row = session.execute(select(*keys).where(id_column == page.after, *scope).limit(1)).first()
    if row is None:
        raise invalid_cursor(page.after)
    return tuple(row)


def after_key(
    keys: Sequence[Any], anchor: Sequence[Any], *, is_descending: bool = False
) -> ColumnElement[bool]:
    """`(keys) > (anchor)` (or `<` when descending) as one row-value comparison, which a B-tree index on
    the keys (after the equality columns of the scope) turns into a range scan."""
    values = [bindparam(None, value, type_=key.type) for key, value in zip(keys, anchor, strict=True)]
    left, right = tuple_(*keys), tuple_(*values)
    return left < right if is_descending else left > right


def ordered_by(keys: Sequence[Any], *, is_descending: bool = False) -> list[Any]:
    """The ORDER BY terms of a keyset over `keys`."""
    return [key.desc() for key in keys] if is_descending else list(keys)


def read_page(
    session: Session,
    query: Select[Any],
    keys: Sequence[Any],
    anchor: Sequence[Any] | None,
    limit: int,
    *,
    is_descending: bool = False,
) -> Page[Any]:
    """The rows of `query` after `anchor` in the order of `keys` (unique together), at most `limit`."""
    if anchor is not None:
        query = query.where(after_key(keys, anchor, is_descending=is_descending))
    query = query.order_by(*ordered_by(keys, is_descending=is_descending)).limit(limit + 1)
    return split_page(list(session.scalars(query)), limit)


def split_page(rows: list[T], limit: int) -> Page[T]:
    """A page of the first `limit` of `rows` (read with `LIMIT limit + 1`)."""
    return Page(rows[:limit], has_more=len(rows) > limit)
