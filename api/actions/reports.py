"""The operator's reports over the usage ledger: billing per tenant and base model, SLO per group
(/v1/admin/billing, /v1/admin/slo and the console's billing download)."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from api.csv_download import CsvFile
from api.errors import ApiError
from registry.billing import billing_report, invoice_to_json, invoices_to_csv
from registry.usage import GROUP_BYS
from registry.usage_reports import slo_report

BILLING_FORMATS = ("json", "csv")


def check_billing_format(format: str) -> None:
    """400 unless `format` is one of BILLING_FORMATS."""
    if format not in BILLING_FORMATS:
        raise ApiError(
            400, "invalid_request", f"format must be one of {', '.join(BILLING_FORMATS)}, not {format!r}"
        )


def check_slo_group_by(group_by: str) -> None:
    """400 unless `group_by` is one of registry.usage.GROUP_BYS."""
    if group_by not in GROUP_BYS:
        raise ApiError(
            400, "invalid_request", f"group_by must be one of {', '.join(GROUP_BYS)}, not {group_by!r}"
        )


def billing(session: Session, start: datetime, end: datetime) -> dict[str, Any]:
    """Invoice lines per tenant and base model for [start, end) as the API's list."""
    lines = billing_report(session, start, end)
    return {
        "object": "list",
        "start": start.isoformat(),
        "end": end.isoformat(),
        "data": [invoice_to_json(line) for line in lines],
    }


def billing_csv(session: Session, start: datetime, end: datetime) -> CsvFile:
    """Invoice lines for [start, end) as CSV, named by the period."""
    lines = billing_report(session, start, end)
    return CsvFile(f"billing_{start:%Y%m%d}_{end:%Y%m%d}.csv", invoices_to_csv(lines))


def slo(session: Session, start: datetime, end: datetime, group_by: str) -> dict[str, Any]:
    """SLO attainment, latency percentiles, counts and error rate per group for [start, end)."""
    groups = slo_report(session, start, end, group_by)
    return {
        "object": "list",
        "start": start.isoformat(),
        "end": end.isoformat(),
        "group_by": group_by,
        "data": [asdict(g) for g in groups],
    }
