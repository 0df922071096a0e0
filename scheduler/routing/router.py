"""Router v1: choose a worker for a request. Pure: plain data in, decision out.

Every policy picks among the *eligible* workers: the ready workers of the base model, restricted to the
placement's assigned ones (RouteRequest.assigned_workers) when any of them is live (`eligible_workers`).
- `residency_least_loaded`: a worker with the adapter on the device, then one with it in host
  memory, then any; within a tier the least loaded *for the request's tenant* wins (`tenant_load`: other
  tenants' backlogs count only as far as fair share would serve them first; ties broken by worker id:
  deterministic).
- `placement_weighted`: LoRAServe's routing, a random draw by the placement weights, blind to live load.
- `rank_aware` (scheduler/routing/caraserve_router.py): CaraServe's least added per-token cost.
- `holders_least_loaded` (default; scheduler/routing/holder_router.py): the least-loaded holder, yielding to load.
Policies are chosen by name (settings.routing.policy) from the table in scheduler/routing/router_policies.py.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from scheduler.routing.perf_model import PerfModel

# A sixteenth of the batch slots: at max_num_seqs 128, 8 requests more than the least-loaded worker
# (scheduler/routing/holder_router.py says why).
DEFAULT_MAX_LOAD_GAP = 0.0625


@dataclass(frozen=True)
class WorkerView:
    """What the router knows about one live worker."""

    worker_id: str
    base_model: str
    num_running: int = 0
    num_waiting: int = 0
    max_num_seqs: int = 1
    device_adapters: frozenset[str] = field(default_factory=frozenset)
    host_adapters: frozenset[str] = field(default_factory=frozenset)
    is_ready: bool = True
    # rank-aware routing (scheduler/routing/caraserve_router.py); defaults = a worker that publishes none of it
    adapter_ranks: Mapping[str, int] = field(default_factory=dict)  # resident adapters (device and host)
    running_ranks: tuple[int, ...] = ()  # one per running request, 0 = base model
    waiting_ranks: tuple[int, ...] = ()  # one per queued request
    num_waiting_prompt_tokens: int = 0  # prompt tokens the queued requests have yet to prefill
    num_waiting_by_tenant: Mapping[str, int] = field(default_factory=dict)  # queued requests per tenant id
    num_free_pool_pages: int = 0
    decode_step_ms: float | None = None  # median of recent decode-only steps (None: none yet)
    prefill_step_ms: float | None = None  # median of recent steps with prefill tokens
    perf_model: PerfModel | None = None  # the worker's profile (None: the router's default model)
    max_lora_rank: int = 0  # the largest adapter rank the worker's engine serves (0: no limit published)
    engine_backend: str = "native"  # the engine behind the worker (native or vllm)

    @property
    def load(self) -> float:
        """Queued plus running requests per batch slot (0 = idle)."""
        return (self.num_running + self.num_waiting) / max(1, self.max_num_seqs)


@dataclass(frozen=True)
class RouteRequest:
    """A request to place: its base model and adapter key (None for the base model itself).

    adapter_rank: the adapter's LoRA rank (0 for the base model); the rank-aware router's cost term.
    assigned_workers: the placement's routing-table row for the adapter, ((worker_id, weight), ...) with
    weights summing to 1; empty means no placement is published and every ready worker is eligible.
    tenant_id: who sends it (None: not known); the load estimate counts only the queued requests fair share
    would serve before it (`tenant_load`).
    """

    base_model: str
    adapter_key: str | None = None
    num_prompt_tokens: int = 0
    predicted_output_tokens: int = 0
    adapter_rank: int = 0
    assigned_workers: tuple[tuple[str, float], ...] = ()
    tenant_id: str | None = None
    engine_features: frozenset[str] = (
        frozenset()
    )  # what the adapter needs beyond plain LoRA (ENGINE_FEATURES)


# What an adapter may need of a worker's engine beyond plain LoRA on the decoder projections.
DORA = "dora"  # peft use_dora: the magnitude rescale
VOCAB_LORA = "vocab_lora"  # LoRA on embed_tokens / lm_head
# The engine backends and what each serves of those (a backend not listed serves none): vLLM's LoRA kernels
# have no DoRA magnitude rescale, and its LoRA no longer covers the embedding or the LM head.
ENGINE_FEATURES: dict[str, frozenset[str]] = {"native": frozenset({DORA, VOCAB_LORA})}
# Per feature: what the adapter is, why an engine without it cannot serve it, and what the tenant can change.
_FEATURE_REFUSALS = {
    DORA: (
        "a DoRA adapter (use_dora: true)",
        "vLLM cannot apply DoRA's magnitude rescale",
        "retrain it with use_dora=False",
    ),
    VOCAB_LORA: (
        "LoRA on embed_tokens / lm_head",
        "vLLM's LoRA does not cover the token embedding or the LM head",
        "retrain it without embed_tokens and lm_head in target_modules",
    ),
}
VOCAB_TARGET_MODULES = ("embed_tokens", "lm_head")


def adapter_engine_features(use_dora: bool, target_modules: Sequence[str]) -> frozenset[str]:
    """What an adapter version needs of an engine (ENGINE_FEATURES), from its validated metadata."""
    features = {DORA} if use_dora else set()
    if any(m in VOCAB_TARGET_MODULES for m in target_modules):
        features.add(VOCAB_LORA)
    return frozenset(features)


def serves_features(engine_backend: str, features: frozenset[str]) -> bool:
    """True when `engine_backend` serves an adapter needing `features`."""
    return features <= ENGINE_FEATURES.get(engine_backend, frozenset())


class Router(Protocol):
    """A routing policy."""

    def choose(self, request: RouteRequest, workers: Sequence[WorkerView]) -> str | None:
        """Return the chosen worker id, or None when no worker can serve the request."""
        ...


def residency_tier(request: RouteRequest, worker: WorkerView) -> int:
    """0 = adapter on device (or no adapter), 1 = adapter in host memory, 2 = cold."""
    if request.adapter_key is None or request.adapter_key in worker.device_adapters:
        return 0
    if request.adapter_key in worker.host_adapters:
        return 1
    return 2


def tenant_load(worker: WorkerView, tenant_id: str | None) -> float:
    """The worker's load as a new request of `tenant_id` sees it: running requests plus the queued ones fair
    share would admit before it, per batch slot. `WorkerView.load` when the tenant is not known or the worker
    publishes no queue per tenant (`num_waiting_by_tenant`).

    Estimate: the tenant's own queued requests all go first (VTC keeps a tenant's order), and each other
    tenant's go first up to `own + 1` of them: `ahead = own + sum(min(queued_t, own + 1))` over the other
    tenants t. Assumption: equal counters and weights, so VTC (scheduler/admission/fair_share.py) interleaves the
    tenants round-robin, one request each per turn, and the new request is in turn `own + 1` of its tenant
    (a tenant gets no turn once its queue is empty). A tenant lifted on arrival to the lowest counter is at
    least level with the others, so a light tenant waits for a batch slot and about one request per other
    backlogged tenant, not behind a heavy tenant's whole backlog; that tenant's own next request does wait
    behind its backlog. Counters differ in practice (bounded: the fair-share module doc) and weights shift
    the turns; the estimate ignores both (other tenants' weights and counters are not published).
    """
    by_tenant = worker.num_waiting_by_tenant
    if tenant_id is None or not by_tenant:
        return worker.load
    own = by_tenant.get(tenant_id, 0)
    ahead = own + sum(min(n, own + 1) for t, n in by_tenant.items() if t != tenant_id)
    return (worker.num_running + min(ahead, worker.num_waiting)) / max(1, worker.max_num_seqs)


def ready_workers(base_model: str, workers: Sequence[WorkerView]) -> list[WorkerView]:
    """The workers that can take a request for `base_model` now (ready, not draining, that base model).

    None of them means a cold start: the request waits for one (see api/cold_start.py).
    """
    return [w for w in workers if w.is_ready and w.base_model == base_model]


def serves_rank(worker: WorkerView, rank: int) -> bool:
    """True if the worker's engine takes an adapter of `rank` (0: the base model, which every worker serves)."""
    return worker.max_lora_rank <= 0 or rank <= worker.max_lora_rank


def serves_adapter(worker: WorkerView, request: RouteRequest) -> bool:
    """True if the worker's engine serves the request's adapter: its rank and its engine features (DoRA, LoRA on
    embed_tokens / lm_head) where it needs some."""
    if not serves_features(worker.engine_backend, request.engine_features):
        return False
    return serves_rank(worker, request.adapter_rank)


def engine_feature_refusal(request: RouteRequest, workers: Sequence[WorkerView]) -> str | None:
    """Why no ready worker of the request's base model can ever serve its adapter's engine features (every one
    runs an engine without them, e.g. vLLM for a DoRA adapter); None when one can, when the adapter needs none,
    or when none is ready (a cold start: the request waits for a worker, which may serve it)."""
    features = request.engine_features
    ready = ready_workers(request.base_model, workers)
    if not features or not ready or any(serves_features(w.engine_backend, features) for w in ready):
        return None
    backends = sorted({w.engine_backend for w in ready})
    missing = sorted(
        f for f in features if not any(f in ENGINE_FEATURES.get(b, frozenset()) for b in backends)
    )
    missing = missing or sorted(features)  # no single backend serves them all together
    what, why, fix = (" and ".join(_FEATURE_REFUSALS[f][i] for f in missing) for i in range(3))
    engines = sorted(b for b, served in ENGINE_FEATURES.items() if features <= served)
    return (
        f"the adapter is {what}, which only the {' / '.join(engines)} engine serves, and every worker serving "
        f"base model {request.base_model!r} runs {' / '.join(backends)} ({why}); {fix}, or ask the operator "
        f"for {' / '.join(engines)} workers of this base model"
    )


def rank_limit_refusal(request: RouteRequest, workers: Sequence[WorkerView]) -> str | None:
    """Why no ready worker of the request's base model can ever serve its adapter's rank (each one's engine
    has a smaller `max_lora_rank`), naming the limit; None when one can, or when none is ready (a cold start:
    the request waits for a worker, which may serve it)."""
    ready = ready_workers(request.base_model, workers)
    if not ready or any(serves_rank(w, request.adapter_rank) for w in ready):
        return None
    limit = max(w.max_lora_rank for w in ready)
    return (
        f"the adapter has rank {request.adapter_rank}, above max_lora_rank {limit} of every worker serving "
        f"base model {request.base_model!r}; retrain it with r <= {limit}, or ask the operator for workers "
        "with a larger engine_max_lora_rank"
    )


def eligible_workers(request: RouteRequest, workers: Sequence[WorkerView]) -> list[tuple[WorkerView, float]]:
    """(worker, placement weight) of the ready workers of the base model whose engine serves the adapter's
    rank (and DoRA, for a DoRA adapter), restricted to the assigned ones among them when any is live; weight 1 each when none is (no
    placement published, or every holder gone)."""
    ready = [w for w in ready_workers(request.base_model, workers) if serves_adapter(w, request)]
    weights: dict[str, float] = {}
    for worker_id, weight in request.assigned_workers:
        weights[worker_id] = weights.get(worker_id, 0.0) + max(0.0, weight)
    assigned = [(w, weights[w.worker_id]) for w in ready if w.worker_id in weights]
    return assigned if assigned else [(w, 1.0) for w in ready]


def rank_mismatch(worker: WorkerView, rank: int) -> tuple[int, int]:
    """How badly a request of LoRA `rank` fits the worker's batches (running and queued requests), with
    kernels padded to the batch's largest rank m: (2, rank - m) when it raises m (every request there pays
    more), (1, m - rank) when it is padded up to m (it alone pays more), (0, 0) when rank == m or the worker
    has no request. Smaller is better."""
    ranks = (*worker.running_ranks, *worker.waiting_ranks)
    if not ranks or rank == max(ranks):
        return (0, 0)
    largest = max(ranks)
    return (2, rank - largest) if rank > largest else (1, largest - rank)


def best_fit(request: RouteRequest, candidates: Sequence[WorkerView]) -> WorkerView:
    """Of `candidates` (non-empty), the one whose batches the request's rank fits best (`rank_mismatch`),
    then residency, then the tenant's load, then worker id."""
    tenant = request.tenant_id
    return min(
        candidates,
        key=lambda w: (
            rank_mismatch(w, request.adapter_rank),
            residency_tier(request, w),
            tenant_load(w, tenant),
            w.worker_id,
        ),
    )


def within_gap(request: RouteRequest, workers: Sequence[WorkerView], max_load_gap: float) -> list[WorkerView]:
    """The workers whose load for the request's tenant is within `max_load_gap` of the least of them."""
    tenant = request.tenant_id
    least = min(tenant_load(w, tenant) for w in workers)
    return [w for w in workers if tenant_load(w, tenant) <= least + max_load_gap]


def routable(request: RouteRequest, workers: Sequence[WorkerView]) -> list[WorkerView]:
    """The ready workers of the request's base model whose engine serves its adapter (rank, DoRA)."""
    return [w for w in ready_workers(request.base_model, workers) if serves_adapter(w, request)]


def yield_to_load(
    chosen: WorkerView, request: RouteRequest, workers: Sequence[WorkerView], max_load_gap: float
) -> WorkerView:
    """`chosen`, unless its load for the request's tenant exceeds the least-loaded routable worker's by more
    than `max_load_gap`: then the `best_fit` of the workers within the gap of that least load (a spilled
    request should not undo the placement's separation of ranks)."""
    pool = routable(request, workers)
    if not pool:
        return chosen
    tenant = request.tenant_id
    if tenant_load(chosen, tenant) <= min(tenant_load(w, tenant) for w in pool) + max_load_gap:
        return chosen
    return best_fit(request, within_gap(request, pool, max_load_gap))


class ResidencyThenLeastLoaded:
    """Router v1: among the eligible workers (the placement's, see `eligible_workers`), prefer adapter
    residency, then the least loaded worker for the request's tenant (`tenant_load`). With `max_load_gap`
    set, the choice yields to the least-loaded ready worker once it is busier by more than the gap
    (`yield_to_load`); None (the default) never yields."""

    def __init__(self, max_load_gap: float | None = None) -> None:
        if max_load_gap is not None and max_load_gap < 0:
            raise ValueError(f"max_load_gap must be >= 0 or None, not {max_load_gap}")
        self.max_load_gap = max_load_gap

    @classmethod
    def from_options(cls, options: RouterOptions) -> ResidencyThenLeastLoaded:
        """Built from settings: `options.max_load_gap` (None: never yields to load)."""
        return cls(options.max_load_gap)

    def choose(self, request: RouteRequest, workers: Sequence[WorkerView]) -> str | None:
        """Pick the best eligible worker serving the request's base model, or None."""
        candidates = [w for w, _ in eligible_workers(request, workers)]
        if not candidates:
            return None
        tenant = request.tenant_id
        best = min(
            candidates, key=lambda w: (residency_tier(request, w), tenant_load(w, tenant), w.worker_id)
        )
        if self.max_load_gap is not None:
            best = yield_to_load(best, request, workers, self.max_load_gap)
        return best.worker_id


class PlacementWeightedRandom:
    """LoRAServe's own routing: a worker drawn at random by the placement weights (phi), blind to live load
    and residency (uniform over the ready workers when no assigned worker is live). The "blind" arm of
    benchmarks/cluster.py. `seed` makes a run reproducible."""

    def __init__(self, seed: int | None = 0) -> None:
        self._rng = random.Random(seed)

    def choose(self, request: RouteRequest, workers: Sequence[WorkerView]) -> str | None:
        """A weighted draw among the eligible workers, or None when there is none."""
        candidates = sorted(eligible_workers(request, workers), key=lambda c: c[0].worker_id)
        if not candidates:
            return None
        total = sum(weight for _, weight in candidates)
        if total <= 0:
            return self._rng.choice(candidates)[0].worker_id
        point = self._rng.random() * total
        for worker, weight in candidates:
            point -= weight
            if point < 0:
                return worker.worker_id
        return candidates[-1][0].worker_id


@dataclass(frozen=True)
class RouterOptions:
    """Settings a policy may read (from settings.routing: slo_tpot_ms, cold_fetch_ms, max_load_gap).

    slo_tpot_ms: the time-per-output-token SLO of the rank-aware cost's penalty (None: per worker, 1.5x its
    single-request decode step at the request's rank, CaraServe's rule). cold_fetch_ms: the estimated fetch
    of an adapter a worker holds nowhere (blob store -> host), on top of its host -> device load.
    """

    slo_tpot_ms: float | None = None
    cold_fetch_ms: float = 50.0
    max_load_gap: float | None = None
