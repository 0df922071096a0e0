"""The placement job: usage rows -> demand forecast -> LoRAServe placement -> published routing table.

Run every settings.jobs.placement_interval_s by Celery beat (`lorahost.compute_placement`, jobs/celery_app.py) or
by an inline timer in the API with inline jobs (api/main.py). Its pure half (steps 2-4 without I/O) is
cluster/placement_table.py, which the cluster twin runs too. One run:
1. token counts (prompt + completion, by start time) per adapter version and per bucket of
   settings.placement.bucket_s, over the history (forecast) and the scale-down cooldown (peak) windows;
2. the demand forecast (scheduler/placement/demand_forecast.py) and, per base model, `compute_placement` over its live,
   ready, non-draining workers with the previous table as the starting point (versions no longer `ready`
   leave the table);
3. publish (routing table, per-worker load and max rank, moved adapters, per base model demand for the
   autoscaler) to the RoutingTableStore;
4. lazy migration, the drop half: a worker that still holds an adapter (its heartbeat's device or host
   adapters) assigned to it neither in this table nor in the previous one is asked to drop it (`drop`, the
   worker's POST /internal/v1/adapters/drop, which refuses while requests use it; refused drops are retried
   on the next run). The previous table is one period old, so API servers (refresh every
   routing_table_refresh_s < placement_interval_s) have stopped routing there; a late request just pulls the
   adapter again. Only adapters placed elsewhere are dropped, so every adapter keeps >= 1 holder.
   The pull half needs nothing here: a worker fetches an adapter from the blob store on its first request.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from cluster.membership import WorkerDirectory
from cluster.placement_table import (
    DropAdapter,
    UsageHistory,
    VersionInfo,
    build_table,
    drop_unassigned,
    num_history_buckets,
)
from cluster.routing_table import RoutingTable, RoutingTableStore
from registry.models import Adapter, AdapterVersion, UsageRecord, utcnow
from settings import Settings

log = logging.getLogger(__name__)

__all__ = [
    "DropAdapter",
    "UsageHistory",
    "VersionInfo",
    "read_usage_history",
    "ready_versions",
    "run_placement",
]


def run_placement(
    session_factory: sessionmaker[Session],
    directory: WorkerDirectory | None,
    store: RoutingTableStore,
    settings: Settings,
    *,
    drop: DropAdapter | None = None,
    now: datetime | None = None,
) -> RoutingTable:
    """Compute and publish the routing table (module docstring); returns what was published."""
    now = now or utcnow()
    previous = store.read()
    with session_factory() as session:
        history = read_usage_history(session, now, settings.placement.bucket_s, num_history_buckets(settings))
        versions = ready_versions(
            session, set(history.adapter_tokens) | set(previous.rows if previous else ())
        )
    records = [r for r in (directory.list_live() if directory else []) if r.is_ready and not r.is_draining]
    table = build_table(history, versions, records, previous, settings, now)
    published = store.publish(table)
    log.info(
        "placement v%d: %d adapters on %d workers, %d moved",
        published.version,
        len(table.rows),
        len(records),
        len(table.moved),
    )
    if drop is not None:
        drop_unassigned(records, published, previous, drop)
    return published


def read_usage_history(session: Session, now: datetime, bucket_s: float, num_buckets: int) -> UsageHistory:
    """Token counts per bucket ending at `now` (one aggregate query per bucket, portable across databases)."""
    adapter_tokens: dict[str, list[float]] = {}
    base_tokens: dict[str, list[float]] = {}
    last_adapter: dict[str, float] = {}
    last_base: dict[str, float] = {}
    tokens = func.sum(UsageRecord.prompt_tokens + UsageRecord.completion_tokens)
    for index in range(num_buckets):
        end = now - timedelta(seconds=bucket_s * (num_buckets - 1 - index))
        start = end - timedelta(seconds=bucket_s)
        rows = session.execute(
            select(
                UsageRecord.adapter_version_id,
                UsageRecord.model_name,
                tokens,
                func.max(UsageRecord.started_at),
            )
            .where(UsageRecord.started_at >= start, UsageRecord.started_at < end)
            .group_by(UsageRecord.adapter_version_id, UsageRecord.model_name)
        ).all()
        for version_id, model_name, num_tokens, last_at in rows:
            counts, last = (adapter_tokens, last_adapter) if version_id else (base_tokens, last_base)
            key = version_id or model_name
            counts.setdefault(key, [0.0] * num_buckets)[index] += float(num_tokens or 0)
            last[key] = max(last.get(key, 0.0), _unix(last_at))
    return UsageHistory(adapter_tokens, base_tokens, last_adapter, last_base)


def ready_versions(session: Session, version_ids: Iterable[str]) -> dict[str, VersionInfo]:
    """Base model and rank of the `ready` versions among `version_ids`."""
    ids = sorted(set(version_ids))
    found: dict[str, VersionInfo] = {}
    for start in range(0, len(ids), 500):
        rows = session.execute(
            select(AdapterVersion.id, AdapterVersion.rank, Adapter.base_model_name)
            .join(Adapter, Adapter.id == AdapterVersion.adapter_id)
            .where(AdapterVersion.id.in_(ids[start : start + 500]), AdapterVersion.status == "ready")
        ).all()
        found.update({vid: VersionInfo(base, rank or 0) for vid, rank, base in rows})
    return found


def _unix(moment: datetime) -> float:
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
