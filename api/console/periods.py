"""The report period of a console page: the same parsing and defaults as the REST reports
(api/query_dates.py), with a bad value shown on the page instead of a JSON error."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from api.errors import ApiError
from api.query_dates import parse_period
from registry.usage_reports import default_period


@dataclass(frozen=True)
class Period:
    """[start, end) and the message of a value that could not be read (then the default period)."""

    start: datetime
    end: datetime
    error: str | None = None

    @property
    def query(self) -> str:
        """The period as a query string for links (CSV download)."""
        return f"start={self.start.isoformat()}&end={self.end.isoformat()}".replace("+", "%2B")


def read_period(start: str | None, end: str | None) -> Period:
    """The period of the query values (empty values: the defaults)."""
    try:
        lo, hi = parse_period(start or None, end or None)
    except ApiError as exc:
        lo, hi = default_period()
        return Period(lo, hi, exc.message)
    return Period(lo, hi)
