"""Recorded demand for the capacity planner (POST /v1/admin/plan): one `UsageSample` per adapter request that
started in the window ending now (usage rows, as the placement job reads them, with the version's rank)."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from registry.models import AdapterVersion, UsageRecord
from twin.planner.recorded_demand import UsageSample


def read_plan_demand(session: Session, now: datetime, window_s: float) -> list[UsageSample]:
    """Adapter requests started in [now - window_s, now)."""
    start = now - timedelta(seconds=window_s)
    rows = session.execute(
        select(
            UsageRecord.adapter_version_id,
            AdapterVersion.rank,
            UsageRecord.tenant_id,
            UsageRecord.prompt_tokens,
            UsageRecord.completion_tokens,
        )
        .join(AdapterVersion, AdapterVersion.id == UsageRecord.adapter_version_id)
        .where(UsageRecord.started_at >= start, UsageRecord.started_at < now)
    ).all()
    return [UsageSample(str(v), int(r or 0), t, int(p or 0), int(c or 0)) for v, r, t, p, c in rows]
