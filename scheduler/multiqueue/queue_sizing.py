"""How the multi-queue policy sizes requests, charges adapters and splits its quotas: two strategies, one knob
(engine_multiqueue_sizing), `make_sizing` builds the one a setting names.

"wrs" (`WrsSizing`, Chameleon, the paper's baseline): a request's class comes from its weighted request size
(scheduler/multiqueue/request_size.py: token lengths times AdapterSize / MaxAdapterSize); its quota charge
is its prompt + predicted output tokens plus, in a unified pool, its adapter's bytes as KV tokens whenever
that adapter was not on the device when the request was first seen (per request: two requests of one cold
adapter both pay for it); quotas are Chameleon's K x M/M/1 minima plus the rest by demand
(scheduler/multiqueue/queue_quotas.py `split_quotas`); a request that does not fit holds back its queue.

"tokens" (`TokenSizing`, the platform's): what binds a memory-bound batch is KV tokens, so
- a request's class comes from its tokens alone (prompt + predicted output), on a log scale: lengths span
  three orders of magnitude, and K-means on the log separates short chats from long documents instead of
  cutting the long tail finely (the conversation trace gives K = 2, centroids ~390 and ~1,700 tokens);
- its quota charge is its tokens; an adapter's bytes count only where adapters take KV pages (a unified
  pool) and once per adapter held by admitted requests, not per request: the held adapters are taken off
  the capacity the queues share (`held_adapter_tokens`), and a waiting request pays for its adapter at
  planning only when it is the oldest waiting request of an adapter no admitted request holds
  (`first_payers`): an adapter already held costs nothing more;
- within a class, requests whose adapter is ready (on the device, being copied, or none) go before those
  that need a load (arrival order within each): they cost only their tokens and no contiguous run of pages
  (scheduler/core/page_pool.py: a unified pool stores an adapter in one run of page ids);
- quotas follow measured demand: each class's share of the token-seconds its window requests held
  (lambda * S * D, Little's law: the tokens it keeps busy on average; `demand_quotas`);
- a request that does not fit is skipped, not waited on (no head-of-line blocking): the age bound holds
  the tail instead (`age_bound`: `MultiQueuePolicy.max_wait_s`, default `slo_s / 5`, grown to half the
  oldest request's wait under a backlog): a request that waited past it is planned before every quota, in
  arrival order, and, when its KV does not fit, stops the step's admission so that freed pages go to it;
  one whose adapter finds no run stops it after twice the bound (before that, admissions that take the
  lowest KV pages need not delay a run that forms among the adapters at the top).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from scheduler.admission.admission import BatchBudget, WaitingRequest
from scheduler.multiqueue.queue_quotas import QueueLoad, split_quotas
from scheduler.multiqueue.request_size import (
    RequestShape,
    SizeScale,
    num_adapter_tokens,
    weighted_request_size,
)

READY_RESIDENCIES = ("device", "copying", "preparing")  # its pages are reserved (a load is planned)
MAX_WAIT_SLO_FRACTION = 0.2  # "tokens": default age bound = slo_s / 5 (4/5 of the SLO left to find memory)
BACKLOG_FRACTION = 0.5  # the bound grows to half the oldest request's wait (see `age_bound`)
ADAPTER_BARRIER_FACTOR = 2.0  # an aged request short of adapter memory stops admission after 2 x the bound


@dataclass(frozen=True)
class WrsSizing:
    """Chameleon's weighted request size, per-request adapter charge and M/M/1 quotas (module doc)."""

    input_weight: float
    output_weight: float
    name: str = "wrs"
    is_head_of_line_blocking: bool = True
    is_ready_first: bool = False
    is_adapter_held_once: bool = False

    def class_size(self, shape: RequestShape, scale: SizeScale) -> float:
        """Chameleon's WRS of the request under `scale`."""
        return weighted_request_size(shape, scale, self.input_weight, self.output_weight)

    def charged_adapter_tokens(self, request: WaitingRequest, budget: BatchBudget) -> int:
        """The KV tokens a request's adapter takes from the KV pool: its bytes as KV tokens in a unified pool
        when it is not on the device (nor being copied) yet; 0 when resident, without an adapter, or with a
        static adapter share (adapters never use KV pages there)."""
        if not budget.is_adapter_memory_shared or request.adapter_residency in READY_RESIDENCIES:
            return 0
        return num_adapter_tokens(request.adapter_num_bytes, budget.num_bytes_per_block, budget.block_size)

    def quotas(self, loads: Sequence[QueueLoad], capacity_tokens: float, slo_s: float) -> list[float]:
        """Chameleon's K x M/M/1 minima, then the rest by demand rate."""
        return split_quotas(loads, capacity_tokens, slo_s)


@dataclass(frozen=True)
class TokenSizing:
    """The platform's sizing: classes by tokens, adapters charged once per held adapter, quotas by measured
    demand, ready adapters first, no head-of-line blocking (module doc)."""

    name: str = "tokens"
    is_head_of_line_blocking: bool = False
    is_ready_first: bool = True
    is_adapter_held_once: bool = True

    def class_size(self, shape: RequestShape, scale: SizeScale) -> float:
        """log2 of the request's tokens (prompt + predicted output)."""
        return math.log2(1 + shape.num_prompt_tokens + shape.num_output_tokens)

    def charged_adapter_tokens(self, request: WaitingRequest, budget: BatchBudget) -> int:
        """Nothing per request: held adapters are charged once, off the capacity."""
        return 0

    def quotas(self, loads: Sequence[QueueLoad], capacity_tokens: float, slo_s: float) -> list[float]:
        """Shares of the capacity by measured token-seconds (`demand_quotas`)."""
        return demand_quotas(loads, capacity_tokens)


Sizing = WrsSizing | TokenSizing
SIZINGS = ("wrs", "tokens")
DEFAULT_SIZING = "wrs"


def make_sizing(name: str, input_weight: float, output_weight: float) -> Sizing:
    """The sizing a setting names (engine_multiqueue_sizing); ValueError naming the choices otherwise."""
    if name == "wrs":
        return WrsSizing(input_weight, output_weight)
    if name == "tokens":
        return TokenSizing()
    raise ValueError(f"unknown multi-queue sizing {name!r}; choose one of {list(SIZINGS)}")


def default_max_wait_s(sizing: Sizing, slo_s: float) -> float | None:
    """The age bound when none is set: `slo_s / 5` for "tokens", none for "wrs" (the paper has none)."""
    return MAX_WAIT_SLO_FRACTION * slo_s if isinstance(sizing, TokenSizing) else None


def age_bound(max_wait_s: float | None, waits_s: Sequence[float]) -> float | None:
    """The wait past which a request is promoted: `max_wait_s`, or BACKLOG_FRACTION of the longest wait in
    `waits_s` when that is longer; None without `max_wait_s`.

    A fixed bound holds the tail while the backlog is shorter than it; under overload every request waits
    past it, all are promoted and the policy is FIFO again (measured in the twin, benchmarks/twin_papers.py
    section 1: with a fixed 1 s bound at 1.1x load, P99 TTFT +4 / +12 / +4% against FIFO over three seeds,
    goodput 0.95-1.01x). Half the oldest wait keeps the oldest request (and any at least half as old) ahead
    of every quota, so the head of the backlog is served in arrival order, while the younger half may be
    reordered for cheaper batches (0.5 and 0.8 tried; 0.8 let single requests wait longer at 0.8x load).
    """
    if max_wait_s is None:
        return None
    return max(max_wait_s, BACKLOG_FRACTION * max(waits_s, default=0.0))


def held_adapter_tokens(adapters: Iterable[tuple[str | None, int]]) -> int:
    """KV tokens of the distinct adapters in `adapters` ((adapter id, its tokens) of the admitted, unfinished
    requests): each adapter counts once however many requests use it."""
    held: dict[str, int] = {}
    for adapter_id, tokens in adapters:
        if adapter_id is not None:
            held[adapter_id] = tokens
    return sum(held.values())


def first_payers(
    waiting: Sequence[tuple[str, str | None, float]], held: Iterable[str | None]
) -> frozenset[str]:
    """Waiting requests ((request id, adapter id, arrival time)) that pay for their adapter at planning: the
    oldest of each adapter that no admitted request holds."""
    held_ids = {a for a in held if a is not None}
    payers: dict[str, tuple[float, str]] = {}
    for request_id, adapter_id, arrival in waiting:
        if adapter_id is None or adapter_id in held_ids:
            continue
        if adapter_id not in payers or (arrival, request_id) < payers[adapter_id]:
            payers[adapter_id] = (arrival, request_id)
    return frozenset(request_id for _, request_id in payers.values())


def demand_quotas(loads: Sequence[QueueLoad], capacity_tokens: float) -> list[float]:
    """Quotas (tokens) adding up to `capacity_tokens`, in proportion to each queue's measured token-seconds
    (lambda * S * D); by lambda * S while no duration is known, evenly without any demand."""
    if not loads:
        raise ValueError("demand_quotas needs at least one queue")
    if capacity_tokens < 0:
        raise ValueError(f"capacity_tokens must be >= 0, got {capacity_tokens}")
    weights = [load.demand_rate * load.mean_service_s for load in loads]
    if not sum(weights) >= sys.float_info.min:  # no measurable demand (0, or too small to divide by)
        weights = [load.demand_rate for load in loads]
    if not sum(weights) >= sys.float_info.min:
        weights = [1.0] * len(loads)
    total = sum(weights)
    return [capacity_tokens * w / total for w in weights]
