"""The placement job's pure half: usage history -> demand forecast -> placement per base model -> the routing
table to publish, and which adapters workers should drop. No database or HTTP: registry/placement_job.py reads
the usage rows and the ready versions and publishes; the cluster twin (twin/cluster_sim.py) feeds
it the simulated usage and workers. Rules in registry/placement_job.py's module docstring.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

from cluster.membership import WorkerRecord
from cluster.routing_table import ModelDemand, RoutingRow, RoutingTable, WorkerPlacement
from scheduler.placement.demand_forecast import forecast_rate
from scheduler.placement.placement import AdapterDemand, PlacementConfig
from scheduler.placement.placement_baselines import PLACEMENT_POLICIES
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


def num_history_buckets(settings: Settings) -> int:
    """Buckets to read: the forecast history or the cooldown window, whichever is longer."""
    return max(settings.placement.history_buckets, num_cooldown_buckets(settings))


def num_cooldown_buckets(settings: Settings) -> int:
    """Buckets of the scale-down cooldown window (at least one)."""
    return max(1, math.ceil(settings.scaling.scale_down_cooldown_s / settings.placement.bucket_s))


def build_table(
    history: UsageHistory,
    versions: Mapping[str, VersionInfo],
    records: list[WorkerRecord],
    previous: RoutingTable | None,
    settings: Settings,
    now: datetime,
) -> RoutingTable:
    """The unpublished table (version 0): placement per base model plus the demand the autoscaler reads."""
    section = settings.placement
    config = PlacementConfig(
        section.resolved_operating_points(),
        section.min_phi,
        section.replication_headroom,
        section.replication_hysteresis,
        section.max_worker_rank_sum,
    )
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
        for key in sorted(set(record.scheduler.device_adapters) | set(record.host_adapters)):
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
