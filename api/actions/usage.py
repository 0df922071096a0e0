"""A tenant's own usage per day and adapter (model name) from the usage ledger (/v1/usage, a page of (day,
model) groups at a time, and the console's usage download). Tokens are what is billed
(registry/usage_reports.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from api.csv_download import CsvFile
from api.pagination import page_response
from registry.pages import PageRequest
from registry.usage_pages import usage_group_page, usage_token_totals
from registry.usage_series import tenant_usage_series, usage_points_to_csv


def tenant_usage(
    session: Session, tenant_id: str, start: datetime, end: datetime, page: PageRequest
) -> dict[str, Any]:
    """A page of the tenant's requests and tokens per (day, model) in [start, end), each group with its `id`
    (`<day>:<model>`, the cursor), and the totals of the whole period."""
    found = usage_group_page(session, tenant_id, start, end, page)
    total_prompt, total_completion = usage_token_totals(session, tenant_id, start, end)
    envelope = page_response(found.items, found.has_more, id_of=lambda group: str(group["id"]))
    return {
        "object": "list",
        "start": start.isoformat(),
        "end": end.isoformat(),
        "total_prompt_tokens": total_prompt,
        "total_completion_tokens": total_completion,
        **envelope.model_dump(exclude={"object"}),
    }


def tenant_usage_csv(session: Session, tenant_id: str, start: datetime, end: datetime) -> CsvFile:
    """The tenant's usage table of [start, end) (tokens, cost, latency, SLO per day and adapter) as CSV."""
    points = tenant_usage_series(session, tenant_id, start, end)
    return CsvFile(f"usage_{start:%Y%m%d}_{end:%Y%m%d}.csv", usage_points_to_csv(points))
