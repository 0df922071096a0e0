"""The placement job: usage rows -> demand forecast -> LoRAServe placement -> published routing table.

Run every settings.jobs.placement_interval_s by Celery beat (`lorahost.compute_placement`, jobs/celery_app.py) or
by an inline timer in the API with inline jobs (api/main.py). One run:
1. token counts (prompt + completion, by start time) per adapter version and per bucket of
   settings.placement.bucket_s, over the history (forecast) and the scale-down cooldown (peak) windows;
2. the demand forecast (scheduler/demand_forecast.py) and, per base model, `compute_placement` over its live,
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
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from cluster.membership import WorkerDirectory, WorkerRecord
from cluster.routing_table import ModelDemand, RoutingRow, RoutingTable, RoutingTableStore, WorkerPlacement
from registry.models import Adapter, AdapterVersion, UsageRecord, utcnow
from scheduler.demand_forecast import forecast_rate
from scheduler.placement import AdapterDemand, PlacementConfig
from scheduler.placement_baselines import PLACEMENT_POLICIES
from settings import Settings

log = logging.getLogger(__name__)

DropAdapter = Callable[[WorkerRecord, str], bool]  # (worker, adapter key) -> dropped?


@dataclass(frozen=True)
class UsageHistory:
    """Tokens per bucket (oldest first, the newest ends now) per adapter version and per base model served
    without an adapter, and the last request start (unix s) per adapter version / base model."""

    adapter_tokens: dict[str, list[float]]
    base_tokens: dict[str, list[float]]
    last_adapter_request: dict[str, float]
    last_base_request: dict[str, float]


@dataclass(frozen=True)
class VersionInfo:
    """What placement needs of a ready adapter version."""

    base_model: str
    rank: int


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


def num_history_buckets(settings: Settings) -> int:
    """Buckets to read: the forecast history or the cooldown window, whichever is longer."""
    return max(settings.placement.history_buckets, num_cooldown_buckets(settings))


def num_cooldown_buckets(settings: Settings) -> int:
    """Buckets of the scale-down cooldown window (at least one)."""
    return max(1, math.ceil(settings.scaling.scale_down_cooldown_s / settings.placement.bucket_s))


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


def build_table(
    history: UsageHistory,
    versions: Mapping[str, VersionInfo],
    records: list[WorkerRecord],
    previous: RoutingTable | None,
    settings: Settings,
    now: datetime,
) -> RoutingTable:
    """The unpublished table (version 0): placement per base model plus the demand the autoscaler reads."""
    config = PlacementConfig(settings.placement.resolved_operating_points(), settings.placement.min_phi)
    rates = {
        key: _forecast(tokens, settings) for key, tokens in history.adapter_tokens.items() if key in versions
    }
    previous_rows = previous.rows if previous else {}
    base_models = sorted({v.base_model for v in versions.values()} | {r.base_model for r in records})
    rows: dict[str, RoutingRow] = {}
    workers: list[WorkerPlacement] = []
    moved: list[str] = []
    for base in base_models:
        keys = sorted(k for k, v in versions.items() if v.base_model == base)
        demands = [AdapterDemand(k, versions[k].rank, rates.get(k, 0.0)) for k in keys]
        placement = PLACEMENT_POLICIES[settings.placement.policy](
            demands,
            [r.worker_id for r in records if r.base_model == base],
            {k: previous_rows[k] for k in keys if k in previous_rows},
            config,
        )
        rows.update(placement.table)
        workers += [
            WorkerPlacement(w.worker_id, base, w.load, w.max_rank, w.num_adapters) for w in placement.workers
        ]
        moved += placement.moved
    known = {*base_models, settings.base_model_name}
    demand = model_demands(history, versions, settings, known)
    return RoutingTable(0, now.timestamp(), rows, tuple(workers), tuple(sorted(moved)), demand)


def model_demands(
    history: UsageHistory, versions: Mapping[str, VersionInfo], settings: Settings, base_models: set[str]
) -> tuple[ModelDemand, ...]:
    """Per base model: forecast and cooldown-peak tokens/s per rank (0 = no adapter) and its last request.

    Rows without an adapter version count for their model name only when it is one of `base_models` (a deleted
    adapter's rows lose their version id and must not look like a base model)."""
    per_model: dict[str, list[tuple[int, list[float], float]]] = {}
    for key, tokens in history.adapter_tokens.items():
        info = versions.get(key)
        if info is not None:
            per_model.setdefault(info.base_model, []).append(
                (info.rank, tokens, history.last_adapter_request[key])
            )
    for model, tokens in history.base_tokens.items():
        if model not in base_models:
            continue
        per_model.setdefault(model, []).append((0, tokens, history.last_base_request[model]))
    cooldown = num_cooldown_buckets(settings)
    demands = []
    for model, series in sorted(per_model.items()):
        forecast: dict[int, float] = {}
        peak: dict[int, float] = {}
        for rank, tokens, _ in series:
            forecast[rank] = forecast.get(rank, 0.0) + _forecast(tokens, settings)
            peak[rank] = peak.get(rank, 0.0) + max(tokens[-cooldown:]) / settings.placement.bucket_s
        demands.append(ModelDemand(model, forecast, peak, max(last for _, _, last in series)))
    return tuple(demands)


def drop_unassigned(
    records: list[WorkerRecord], table: RoutingTable, previous: RoutingTable | None, drop: DropAdapter
) -> list[tuple[str, str]]:
    """Ask each worker to drop the adapters it holds that are placed elsewhere and were assigned to it in
    neither `table` nor `previous`; returns the (worker, adapter) pairs it dropped."""
    dropped = []
    for record in records:
        for key in sorted(set(record.device_adapters) | set(record.host_adapters)):
            is_unassigned = _is_unassigned(record.worker_id, key, table)
            was_unassigned = previous is not None and _is_unassigned(record.worker_id, key, previous)
            if is_unassigned and was_unassigned and _try_drop(drop, record, key):
                dropped.append((record.worker_id, key))
    return dropped


def _is_unassigned(worker_id: str, key: str, table: RoutingTable) -> bool:
    row = table.rows.get(key, ())
    return bool(row) and worker_id not in {w for w, _ in row}


def _try_drop(drop: DropAdapter, record: WorkerRecord, key: str) -> bool:
    try:
        return drop(record, key)
    except Exception as exc:  # noqa: BLE001 - an unreachable worker: try again on the next run
        log.warning("could not ask worker %s to drop adapter %s: %s", record.worker_id, key, exc)
        return False


def _forecast(tokens: list[float], settings: Settings) -> float:
    return forecast_rate(
        tokens[-settings.placement.history_buckets :],
        settings.placement.bucket_s,
        settings.placement.ewma_alpha,
    )


def _unix(moment: datetime) -> float:
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
