"""The engine core's part of a worker's state: what the batch scheduler, the page pool, the adapter residency
and the prefix cache count and hold, built by `BatchScheduler.make_stats()` (vLLM v1's
`Scheduler.make_stats()`).

One typed model, composed outwards: the engine's `EngineStats` (scheduler/core/engine_stats.py) is these
fields plus the core's counters and the executor's typed stats; `cluster.protocol.WorkerStats` holds these
fields as its `scheduler` part, next to the engine's `EngineSummary` and the worker's own fields (what GET
/stats answers, built by `cluster.worker_stats.build_worker_stats`), `cluster.membership.WorkerRecord` is
WorkerStats plus the worker's URL (what heartbeats carry) and the router reads its `WorkerView` off a
record (`cluster.worker_view.worker_view`). A routing signal the core computes is a field here, filled in
`make_stats` below, a field of `scheduler.routing.router.WorkerView` that a policy reads, and one line of
`worker_view` (tests/cluster/test_worker_view.py fails while it is missing). Field names are JSON names
(the engine's flat export and the `scheduler` object of /stats and heartbeats use them); every field has a
default, so a worker whose engine publishes less still parses; unknown fields are refused.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, TypedDict

from pydantic import BaseModel, ConfigDict, Field

from scheduler.admission.fair_share import ANONYMOUS_TENANT, base_policy

if TYPE_CHECKING:
    from scheduler.core.adapter_residency import AdapterResidency
    from scheduler.core.batch_scheduler import BatchScheduler
    from scheduler.core.sequence import Sequence


class SchedulerStats(BaseModel):
    """Queues, page pool split, adapter residency and cache counters, and the router's inputs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # queues
    num_running: int = 0
    num_waiting: int = 0
    num_preemptions: int = 0
    # KV blocks (free = free pages plus unreferenced cached prefix blocks) and the page pool split
    num_free_kv_blocks: int = 0
    num_total_kv_blocks: int = 0
    num_pool_pages: int = 0
    num_kv_pages_used: int = 0
    num_adapter_pages: int = 0
    num_free_pool_pages: int = 0
    # prefix cache
    num_cached_blocks: int = 0
    num_prefix_cache_hit_tokens: int = 0
    num_prefix_cache_query_tokens: int = 0
    # adapter residency: device adapters least recently used first; adapters registered on the host only
    device_adapters: tuple[str, ...] = ()
    num_device_adapters: int = 0
    num_host_adapters: int = 0
    adapter_eviction_policy: str = ""
    # adapter cache (device tier): hits/misses at admission, copies planned or prefetched, evictions
    num_adapter_hits: int = 0
    num_adapter_misses: int = 0
    num_adapter_prefetches: int = 0
    num_adapter_loads: int = 0
    num_adapter_evictions: int = 0
    num_timed_adapter_loads: int = 0
    adapter_load_seconds_total: float = 0.0
    # cold adapters: prefills run on the host copy while the copy lands (CPU-assisted), requests that waited
    num_cpu_assisted_prefills: int = 0
    num_copy_waits: int = 0
    num_prepare_waits: int = 0  # requests that waited for their adapter's host copy (read, validate, pack)
    # routing state (scheduler/routing/router.py, scheduler/routing/caraserve_router.py)
    adapter_ranks: dict[str, int] = Field(
        default_factory=dict
    )  # registered adapters (device and host) -> rank
    running_ranks: tuple[int, ...] = ()  # one per running request, 0 = base model
    waiting_ranks: tuple[int, ...] = ()  # one per queued request
    num_waiting_prompt_tokens: int = 0  # prompt tokens the queued requests have yet to prefill
    num_waiting_by_queue: tuple[int, ...] = ()  # queued requests per size class (multiqueue policies)
    # queued requests per tenant id (the router's fair-share load estimate, scheduler/routing/router.py `tenant_load`)
    num_waiting_by_tenant: dict[str, int] = Field(default_factory=dict)
    # running and queued requests per adapter id (base-model requests are not counted): Prometheus's
    # per-adapter gauges, the same from every engine
    num_running_by_adapter: dict[str, int] = Field(default_factory=dict)
    num_waiting_by_adapter: dict[str, int] = Field(default_factory=dict)
    # registered adapters -> copies to the device since registration, and the last measured copy's seconds
    # (the console's per-adapter cold starts and load time)
    adapter_num_loads: dict[str, int] = Field(default_factory=dict)
    adapter_load_seconds: dict[str, float] = Field(default_factory=dict)


class QueueSignals(TypedDict):
    """The routing signals of the core's queues: fields of `SchedulerStats` and of the router's `WorkerView`
    under the same names, read off the queues alone (`queue_signals`)."""

    num_running: int
    num_waiting: int
    running_ranks: tuple[int, ...]
    waiting_ranks: tuple[int, ...]
    num_waiting_prompt_tokens: int
    num_waiting_by_tenant: dict[str, int]


def queue_signals(scheduler: BatchScheduler) -> QueueSignals:
    """The queues' routing signals now (`make_stats` publishes them; they change only when the queues do,
    i.e. with `BatchScheduler.version`)."""
    waiting = list(scheduler.waiting.values())
    ranks = scheduler.residency.adapter_ranks()
    return QueueSignals(
        num_running=len(scheduler.running),
        num_waiting=len(waiting),
        running_ranks=tuple([ranks.get(s.adapter_id, 0) if s.adapter_id else 0 for s in scheduler.running]),
        waiting_ranks=tuple([ranks.get(s.adapter_id, 0) if s.adapter_id else 0 for s in waiting]),
        num_waiting_prompt_tokens=sum(max(0, s.num_prompt_tokens - s.num_computed_tokens) for s in waiting),
        num_waiting_by_tenant=_waiting_by_tenant(waiting),
    )


def make_stats(scheduler: BatchScheduler) -> SchedulerStats:
    """The core's counters and state now (read between steps; `BatchScheduler.make_stats`)."""
    pool, residency, cache = scheduler.pool, scheduler.residency, scheduler.prefix_cache
    ranks = residency.adapter_ranks()
    waiting = list(scheduler.waiting.values())
    device = residency.device_adapters()
    running_ids = [s.adapter_id for s in scheduler.running]
    return SchedulerStats(
        **queue_signals(scheduler),
        num_preemptions=scheduler.num_preemptions,
        num_free_kv_blocks=scheduler.num_reclaimable_blocks(),
        num_total_kv_blocks=pool.num_blocks,
        num_pool_pages=pool.num_pages,
        num_kv_pages_used=pool.num_kv_pages,
        num_adapter_pages=pool.num_adapter_pages,
        num_free_pool_pages=pool.num_free_pages,
        num_cached_blocks=cache.num_cached_blocks if cache is not None else 0,
        num_prefix_cache_hit_tokens=cache.num_hit_tokens if cache is not None else 0,
        num_prefix_cache_query_tokens=cache.num_query_tokens if cache is not None else 0,
        device_adapters=tuple(device),
        num_device_adapters=len(device),
        num_host_adapters=residency.num_host_adapters(),
        adapter_eviction_policy=residency.policy.name,
        num_adapter_hits=scheduler.num_adapter_hits,
        num_adapter_misses=scheduler.num_adapter_misses,
        num_adapter_prefetches=scheduler.num_adapter_prefetches,
        num_adapter_loads=residency.num_loads,
        num_adapter_evictions=residency.num_evictions,
        num_timed_adapter_loads=residency.num_timed_loads,
        adapter_load_seconds_total=residency.load_seconds_total,
        num_cpu_assisted_prefills=scheduler.copy_gate.num_cpu_assisted_prefills,
        num_copy_waits=scheduler.copy_gate.num_copy_waits,
        num_prepare_waits=scheduler.copy_gate.num_prepare_waits,
        adapter_ranks=dict(ranks),
        num_waiting_by_queue=_waiting_by_queue(scheduler, waiting),
        num_running_by_adapter=count_by_adapter(running_ids),
        num_waiting_by_adapter=count_by_adapter(s.adapter_id for s in waiting),
        adapter_num_loads=_num_loads_by_adapter(residency, ranks),
        adapter_load_seconds=_load_seconds_by_adapter(residency, ranks),
    )


def _num_loads_by_adapter(residency: AdapterResidency, adapter_ids: Iterable[str]) -> dict[str, int]:
    states = (residency.get(a) for a in adapter_ids)
    return {s.adapter_id: s.num_loads for s in states if s is not None and s.num_loads}


def _load_seconds_by_adapter(residency: AdapterResidency, adapter_ids: Iterable[str]) -> dict[str, float]:
    states = (residency.get(a) for a in adapter_ids)
    return {s.adapter_id: s.load_seconds for s in states if s is not None and s.load_seconds is not None}


def _waiting_by_queue(scheduler: BatchScheduler, waiting: list[Sequence]) -> tuple[int, ...]:
    """Queued requests per size class when the batch policy has size-class queues (else ())."""
    policy = base_policy(scheduler.policy)
    num_queues, queue_of = getattr(policy, "num_queues", None), getattr(policy, "queue_of", None)
    if not isinstance(num_queues, int) or queue_of is None:
        return ()
    counts = [0] * num_queues
    for seq in waiting:
        index = queue_of(seq.request_id)
        if index is not None and 0 <= index < num_queues:
            counts[index] += 1
    return tuple(counts)


def _waiting_by_tenant(waiting: list[Sequence]) -> dict[str, int]:
    """Queued requests per tenant id (requests without one under fair share's anonymous tenant, "")."""
    counts: dict[str, int] = {}
    for seq in waiting:
        tenant = ANONYMOUS_TENANT if seq.tenant_id is None else seq.tenant_id
        counts[tenant] = counts.get(tenant, 0) + 1
    return counts


def count_by_adapter(adapter_ids: Iterable[str | None]) -> dict[str, int]:
    """Requests per adapter id (None, the base model, is not counted)."""
    return {a: n for a, n in Counter(adapter_ids).items() if a is not None}
