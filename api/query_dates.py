"""Date query parameters (`start`, `end`) of the usage and report routes: one parser and one accepted range
for /v1/usage, /v1/admin/billing, /v1/admin/slo and /v1/admin/predictor.

Python datetimes stop at years 1 and 9999: a moment near either end with a UTC offset (0001-01-01T00:00:00+01:00)
cannot be converted to UTC, and a report window reaching past it cannot be computed. Moments are therefore
accepted in [EARLIEST_MOMENT, LATEST_MOMENT] only, checked before any arithmetic, so every route that
subtracts a window (at most 90 days) or converts to UTC stays far from the ends; anything else is a 400
naming the parameter and the range.
"""

from __future__ import annotations

from datetime import UTC, datetime

from api.errors import ApiError
from registry.usage import as_utc
from registry.usage_reports import default_period

DATE_FORMAT_HINT = "ISO 8601 in UTC, e.g. 2026-11-01 or 2026-11-01T10:00:00 (or with an offset, +00:00)"
EARLIEST_MOMENT = datetime(1970, 1, 1, tzinfo=UTC)  # no usage exists before the Unix epoch
LATEST_MOMENT = datetime(9999, 1, 1, tzinfo=UTC)  # a year before datetime.max: room for any report window


def accepted_range() -> str:
    """The accepted range as said in error messages."""
    return f"between {EARLIEST_MOMENT.isoformat()} and {LATEST_MOMENT.isoformat()}"


def parse_moment(value: str | None, name: str) -> datetime | None:
    """An ISO 8601 date/datetime query value as aware UTC (naive = UTC), None when absent; 400 when it is not
    a date or lies outside [EARLIEST_MOMENT, LATEST_MOMENT]."""
    if value is None or value == "":
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00").replace(" ", "+"))
    except ValueError as exc:
        raise ApiError(
            400, "invalid_request", f"{name}={value!r} is not a date: use {DATE_FORMAT_HINT}"
        ) from exc
    # Aware datetimes compare without converting (no overflow); naive ones are UTC.
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    if not EARLIEST_MOMENT <= aware <= LATEST_MOMENT:
        raise ApiError(
            400, "invalid_request", f"{name}={value!r} is out of range: use a moment {accepted_range()}"
        )
    return as_utc(aware)


def parse_period(start: str | None, end: str | None) -> tuple[datetime, datetime]:
    """[start, end) from query values; defaults to the last 30 days; 400 when a value is bad or start >= end."""
    default_start, default_end = default_period()
    lo = parse_moment(start, "start") or default_start
    hi = parse_moment(end, "end") or default_end
    if lo >= hi:
        raise ApiError(
            400, "invalid_request", f"start ({lo.isoformat()}) must be before end ({hi.isoformat()})"
        )
    return lo, hi
