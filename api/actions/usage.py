"""A tenant's own usage per day and adapter (model name) from the usage ledger (/v1/usage and the console's
usage download). Tokens are what is billed (registry/usage_reports.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from api.csv_download import CsvFile
from registry.usage_reports import load_rows, usage_by_adapter_day
from registry.usage_series import tenant_usage_series, usage_points_to_csv


def tenant_usage(session: Session, tenant_id: str, start: datetime, end: datetime) -> dict[str, Any]:
    """The tenant's requests and tokens per (day, model) in [start, end), with the totals."""
    data = usage_by_adapter_day(load_rows(session, start, end, tenant_id))
    return {
        "object": "list",
        "start": start.isoformat(),
        "end": end.isoformat(),
        "total_prompt_tokens": sum(int(d["prompt_tokens"]) for d in data),  # type: ignore[call-overload]
        "total_completion_tokens": sum(int(d["completion_tokens"]) for d in data),  # type: ignore[call-overload]
        "data": data,
    }


def tenant_usage_csv(session: Session, tenant_id: str, start: datetime, end: datetime) -> CsvFile:
    """The tenant's usage table of [start, end) (tokens, cost, latency, SLO per day and adapter) as CSV."""
    points = tenant_usage_series(session, tenant_id, start, end)
    return CsvFile(f"usage_{start:%Y%m%d}_{end:%Y%m%d}.csv", usage_points_to_csv(points))
