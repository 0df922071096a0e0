"""Chameleon's non-preemptive multi-queue scheduler as a `BatchPolicy` (engine_batch_policy="multiqueue").

Two sizings (`sizing`, engine_multiqueue_sizing; scheduler/multiqueue/queue_sizing.py, where the rules of each
are): "wrs", the paper's, described below, and "tokens", the platform's, with an age bound (`age_bound_s`).

Requests are put in size classes (queues) by their weighted request size (scheduler/multiqueue/request_size.py), with
the classes found by exact K-means over the sizes of a sliding window of recently seen requests and a K
selection that can choose fewer than `max_queues` (scheduler/multiqueue/queue_clustering.py). Each queue holds a
token quota (scheduler/multiqueue/queue_quotas.py: M/M/1 minimum for the TTFT SLO, the rest by demand); each step's
admissions are formed in two phases with a progress rule and an opportunistic adapter bypass
(scheduler/multiqueue/queue_admission.py).

State kept here:
- the window (`window_size` requests, in the order first seen): each request's prompt tokens, predicted
  output tokens, adapter bytes, need in tokens, arrival time and, once it finished, its service duration
  (admission to finish, on the scheduler's clock);
- the classes and per-queue loads, refreshed every `refresh_s` seconds once the window holds
  `min_samples` requests (until then: one queue holding the whole capacity). A request keeps the queue it
  was put in when first seen; when a refresh leaves fewer queues, requests of a vanished queue move to the
  largest remaining one;
- per request: its queue, its need, and whether its need is charged. The need is charged when the
  scheduler admits it (`on_admitted`), exactly once even if it is preempted and admitted again, and
  returned when it finishes or is aborted (`on_finished`).

Capacity, in the binding resource: the KV pool's tokens (`BatchBudget.num_total_blocks * block_size`; the
running batch's token bound `BatchBudget.max_running_tokens` instead when that is smaller), or,
when sequence slots run out first (`max_num_seqs` requests of the window's mean need fit in the pool), the
`max_num_seqs` slots: then every request is charged one slot and the M/M/1 rule runs with S = 1 slot.
Quotas are in the unit that forms the queue, so they add up to what the engine can actually run (quotas in
tokens against a slot-bound engine would either never bind or leave slots idle). A request's need is what it
takes of the KV pool in the configured memory mode (WRS: `charged_adapter_tokens`): its prompt and predicted
output tokens, plus, in a unified pool (`BatchBudget.is_adapter_memory_shared`), its adapter's bytes as KV
tokens (`num_bytes_per_block`) when the adapter was not on the device (nor being copied) when the policy
first saw the request. With a static adapter share (engine_memory_mode "static") adapters never take KV
pages, so they are charged nothing against the KV quotas: their own share is the residency's to manage
(a request whose adapter finds no room there is blocked and may be bypassed, below).
For the bypass, a running request gives back what a blocked adapter needs: its need (unified: adapter pages
come out of the KV pool), or its adapter's pages (static: out of the adapter share).
Time estimates for the bypass: a request's run time is its predicted output tokens times the measured
seconds per predicted output token (the window's total service time over its total predicted output of
finished requests; `default_seconds_per_token` before any finished); prefill time is not modelled.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduler.admission.admission import AdmissionPlan, BatchBudget, WaitingRequest
from scheduler.multiqueue.queue_admission import QueuedRequest, RunningRequest, bypass_ids, two_phase_order
from scheduler.multiqueue.queue_clustering import DEFAULT_MAX_SPLIT_RATIO, QueueLayout, fit_queue_layout
from scheduler.multiqueue.queue_quotas import QueueLoad, split_quotas
from scheduler.multiqueue.queue_sizing import (
    ADAPTER_BARRIER_FACTOR,
    DEFAULT_SIZING,
    READY_RESIDENCIES,
    age_bound,
    default_max_wait_s,
    first_payers,
    held_adapter_tokens,
    make_sizing,
)
from scheduler.multiqueue.queue_window import WindowSample, seconds_per_output_token, window_load
from scheduler.multiqueue.request_size import (
    INPUT_WEIGHT,
    OUTPUT_WEIGHT,
    RequestShape,
    SizeScale,
    num_adapter_tokens,
)

DEFAULT_MAX_QUEUES = 4  # Chameleon's Kmax
DEFAULT_SLO_S = 5.0  # TTFT SLO of the quota rule
DEFAULT_REFRESH_S = 300.0  # Chameleon's T_refresh (5 min)
DEFAULT_WINDOW_SIZE = 1000
DEFAULT_MIN_SAMPLES = 50  # fewer recent requests than this: one queue (K-means on a handful says little)
DEFAULT_SECONDS_PER_TOKEN = 0.02


@dataclass
class _Tracked:
    """A request the policy has seen and not yet seen finish."""

    sample: WindowSample
    queue: int
    seen_order: int
    admitted_at: float | None = None  # set on the first admission: the need is charged from then on
    is_running: bool = False  # admitted and not back in the waiting queue (a preemption)

    @property
    def is_charged(self) -> bool:
        return self.admitted_at is not None


class MultiQueuePolicy:
    """Size-class queues with token quotas, two-phase admission and adapter bypass (module doc)."""

    def __init__(
        self,
        max_queues: int = DEFAULT_MAX_QUEUES,
        slo_s: float = DEFAULT_SLO_S,
        refresh_s: float = DEFAULT_REFRESH_S,
        window_size: int = DEFAULT_WINDOW_SIZE,
        min_samples: int = DEFAULT_MIN_SAMPLES,
        max_split_ratio: float = DEFAULT_MAX_SPLIT_RATIO,
        default_seconds_per_token: float = DEFAULT_SECONDS_PER_TOKEN,
        input_weight: float = INPUT_WEIGHT,
        output_weight: float = OUTPUT_WEIGHT,
        sizing: str = DEFAULT_SIZING,
        max_wait_s: float | None = None,
    ) -> None:
        """`sizing`: "wrs" (Chameleon) or "tokens" (the platform's; scheduler/multiqueue/queue_sizing.py);
        `max_wait_s`: the least age bound past which a waiting request is planned ahead of every quota and
        holds back the step's admission until it fits (it grows with the backlog: `age_bound_s`; None: the
        sizing's default, `slo_s / 5` for "tokens" and none for "wrs"; math.inf: none)."""
        if max_queues < 1 or window_size < 1 or min_samples < 1:
            raise ValueError(
                f"max_queues, window_size and min_samples must be >= 1, got {max_queues}, {window_size}, {min_samples}"
            )
        if min(slo_s, refresh_s, max_split_ratio, default_seconds_per_token) <= 0:
            raise ValueError(
                "slo_s, refresh_s, max_split_ratio and default_seconds_per_token must be positive"
            )
        if input_weight < 0 or output_weight < 0 or input_weight + output_weight <= 0:
            raise ValueError("input_weight and output_weight must be >= 0 and not both 0")
        if max_wait_s is not None and max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0 or None, got {max_wait_s}")
        self.sizing = make_sizing(sizing, input_weight, output_weight)
        self.max_wait_s = default_max_wait_s(self.sizing, slo_s) if max_wait_s is None else max_wait_s
        self._age_bound_s: float | None = self.max_wait_s
        self.max_queues = max_queues
        self.slo_s = slo_s
        self.refresh_s = refresh_s
        self.min_samples = min_samples
        self.max_split_ratio = max_split_ratio
        self.default_seconds_per_token = default_seconds_per_token
        self._window: deque[WindowSample] = deque(maxlen=window_size)
        self._tracked: dict[str, _Tracked] = {}
        self._seen = itertools.count()
        self._scale = SizeScale()
        self._layout = QueueLayout()
        self._loads: list[QueueLoad] = [QueueLoad(0.0, 0.0, 0.0)]
        self._last_refresh: float | None = None
        self._now = 0.0
        self._quotas: tuple[float, ...] = ()
        self._is_slot_bound = False
        self._is_adapter_memory_shared = True
        self.num_refreshes = 0

    # ---- what tests, benchmarks and stats may read ---------------------------------------------------

    @property
    def layout(self) -> QueueLayout:
        """The current size classes (centroids and cut-offs of the weighted request size)."""
        return self._layout

    @property
    def num_queues(self) -> int:
        """How many queues the last refresh chose (1 until the window holds `min_samples` requests)."""
        return self._layout.num_queues

    @property
    def age_bound_s(self) -> float | None:
        """The wait past which a request was promoted at the last `plan`: `max_wait_s`, or half the oldest
        request's wait when that is longer (scheduler/multiqueue/queue_sizing.py `age_bound`); None: no bound."""
        return self._age_bound_s

    @property
    def quota_tokens(self) -> tuple[float, ...]:
        """Each queue's quota at the last `plan` (empty before the first)."""
        return self._quotas

    @property
    def is_slot_bound(self) -> bool:
        """True when the last `plan` found sequence slots scarcer than KV tokens: quotas count slots."""
        return self._is_slot_bound

    def charged_tokens(self) -> list[float]:
        """Quota units charged to each queue now (admitted requests not yet finished): tokens, or slots when
        `is_slot_bound`."""
        charged = [0.0] * self.num_queues
        for tracked in self._tracked.values():
            if tracked.is_charged:
                charged[tracked.queue] += self._need(tracked.sample)
        return charged

    def queue_of(self, request_id: str) -> int | None:
        """The queue of a request the policy has seen and not seen finish, else None."""
        tracked = self._tracked.get(request_id)
        return tracked.queue if tracked is not None else None

    def need_tokens(self, request_id: str) -> int | None:
        """The quota charge of a request the policy has seen and not seen finish, else None."""
        tracked = self._tracked.get(request_id)
        return tracked.sample.need_tokens if tracked is not None else None

    # ---- BatchPolicy ----------------------------------------------------------------------------------

    def plan(self, waiting: Sequence[WaitingRequest], budget: BatchBudget) -> AdmissionPlan:
        """Track new requests, refresh classes and loads when due, then plan the two-phase admission."""
        self._now = (
            budget.now if budget.now is not None else max([self._now, *(r.arrival_time for r in waiting)])
        )
        self._is_adapter_memory_shared = budget.is_adapter_memory_shared
        new = [r for r in waiting if r.request_id not in self._tracked]
        samples = [self._sample(r, budget) for r in new]
        self._window.extend(samples)
        self._maybe_refresh()
        for request, sample in zip(new, samples, strict=True):
            self._tracked[request.request_id] = _Tracked(
                sample, self._classify(sample.shape), next(self._seen)
            )
        for request in waiting:
            self._tracked[request.request_id].is_running = False  # a preempted request is back here
        pool_tokens = self._pool_tokens(budget)
        self._is_slot_bound = self._slots_bind(budget, pool_tokens)
        charged = self.charged_tokens()
        self._quotas = tuple(self._split(pool_tokens, budget))
        if budget.num_free_seqs <= 0 or budget.num_free_tokens <= 0:
            return AdmissionPlan(request_ids=())
        self._age_bound_s = age_bound(self.max_wait_s, [self._waited(r.arrival_time) for r in waiting])
        seconds_per_token = seconds_per_output_token(self._window, self.default_seconds_per_token)
        planned = two_phase_order(self._queues(waiting, seconds_per_token), self._quotas, charged)
        aged = [r for r, _ in planned if r.is_aged]
        return AdmissionPlan(
            request_ids=tuple(r.request_id for r, _ in planned),
            is_head_of_line_blocking=self.sizing.is_head_of_line_blocking,
            group_ids=tuple(q for _, q in planned),
            bypass_ids=bypass_ids(planned, self._running(seconds_per_token)),
            barrier_ids=frozenset(r.request_id for r in aged),
            adapter_barrier_ids=frozenset(
                r.request_id
                for r in aged
                if self._waited(r.arrival_time) >= ADAPTER_BARRIER_FACTOR * (self._age_bound_s or 0.0)
            ),
        )

    def on_admitted(self, request_id: str, now: float | None = None) -> None:
        """Charge the request's need to its queue on its first admission (a readmission charges nothing)."""
        tracked = self._tracked.get(request_id)
        if tracked is None:
            raise ValueError(f"request {request_id!r} was admitted but never planned by this policy")
        if tracked.admitted_at is None:
            tracked.admitted_at = self._now if now is None else now
        tracked.is_running = True

    def on_finished(self, request_id: str, now: float | None = None) -> None:
        """Return the request's charge and record its service duration (unknown ids are ignored)."""
        tracked = self._tracked.pop(request_id, None)
        if tracked is None or tracked.admitted_at is None:
            return
        tracked.sample.duration_s = max(0.0, (self._now if now is None else now) - tracked.admitted_at)

    def on_tokens_served(self, num_output_tokens: Mapping[str, int]) -> None:
        """Quotas charge a request's predicted need at admission, not tokens as served: nothing to do."""
        return

    # ---- helpers --------------------------------------------------------------------------------------

    def _sample(self, request: WaitingRequest, budget: BatchBudget) -> WindowSample:
        shape = RequestShape(
            request.num_prompt_tokens, request.num_predicted_output_tokens, request.adapter_num_bytes
        )
        adapter_tokens = num_adapter_tokens(
            shape.num_adapter_bytes, budget.num_bytes_per_block, budget.block_size
        )
        charged = self.sizing.charged_adapter_tokens(request, budget)
        return WindowSample(request.arrival_time, shape, request.adapter_id, adapter_tokens, charged)

    def _classify(self, shape: RequestShape) -> int:
        return self._layout.queue_of(self.sizing.class_size(shape, self._scale))

    def _waited(self, arrival_time: float) -> float:
        return self._now - arrival_time

    def _held_adapters(self) -> list[tuple[str | None, int]]:
        """(adapter id, its KV tokens) of every admitted, unfinished request."""
        return [
            (t.sample.adapter_id, t.sample.adapter_tokens) for t in self._tracked.values() if t.is_charged
        ]

    def _split(self, pool_tokens: float, budget: BatchBudget) -> list[float]:
        """Each queue's quota: slots by the M/M/1 rule when slots bind, else tokens by the sizing's rule, out
        of the pool less the held adapters when the sizing charges each held adapter once (unified pool)."""
        if self._is_slot_bound:
            return split_quotas(self._unit_loads(), float(budget.max_num_seqs), self.slo_s)
        is_held_charged = self.sizing.is_adapter_held_once and budget.is_adapter_memory_shared
        held = held_adapter_tokens(self._held_adapters()) if is_held_charged else 0
        return self.sizing.quotas(self._loads, max(0.0, pool_tokens - held), self.slo_s)

    def _pool_tokens(self, budget: BatchBudget) -> float:
        """The KV pool in tokens (without `num_total_blocks`: free blocks plus what is charged), or the running
        batch's token bound when that is smaller."""
        if budget.num_total_blocks > 0:
            pool = float(budget.num_total_blocks * budget.block_size)
        else:
            charged = sum(t.sample.need_tokens for t in self._tracked.values() if t.is_charged)
            pool = float(budget.num_free_blocks * budget.block_size + charged)
        return min(pool, float(budget.max_running_tokens)) if budget.max_running_tokens > 0 else pool

    def _slots_bind(self, budget: BatchBudget, pool_tokens: float) -> bool:
        """Sequence slots run out before KV tokens: `max_num_seqs` requests of the window's mean need fit."""
        if budget.max_num_seqs <= 0 or not self._window:
            return False
        mean_need = sum(s.need_tokens for s in self._window) / len(self._window)
        return budget.max_num_seqs * mean_need < pool_tokens

    def _need(self, sample: WindowSample) -> int:
        """A request's quota charge in the binding resource's units: one slot, or its need in tokens."""
        return 1 if self._is_slot_bound else sample.need_tokens

    def _unit_loads(self) -> list[QueueLoad]:
        """The queues' loads in the binding resource's units (S = one slot per request when slot-bound)."""
        if not self._is_slot_bound:
            return self._loads
        return [
            QueueLoad(1.0 if load.arrival_rate > 0 else 0.0, load.mean_service_s, load.arrival_rate)
            for load in self._loads
        ]

    def _maybe_refresh(self) -> None:
        if len(self._window) < self.min_samples:
            return
        if self._last_refresh is not None and self._now - self._last_refresh < self.refresh_s:
            return
        self._refresh()

    def _refresh(self) -> None:
        """New classes from the window's sizes, and each class's load from the window's requests."""
        samples = list(self._window)
        scale = SizeScale.of(s.shape for s in samples)
        sizes = [self.sizing.class_size(s.shape, scale) for s in samples]
        layout = fit_queue_layout(sizes, self.max_queues, self.max_split_ratio)
        classes = [layout.queue_of(size) for size in sizes]
        self._scale, self._layout, self._last_refresh = scale, layout, self._now
        self._loads = [
            window_load(self._now, [s for s, c in zip(samples, classes, strict=True) if c == q], samples)
            for q in range(layout.num_queues)
        ]
        for tracked in self._tracked.values():
            tracked.queue = min(tracked.queue, layout.num_queues - 1)
        self.num_refreshes += 1

    def _queues(
        self, waiting: Sequence[WaitingRequest], seconds_per_token: float
    ) -> list[list[QueuedRequest]]:
        """Each queue's waiting requests: already charged ones (preempted) first, then those past the age bound,
        then (not aged: when the sizing puts ready adapters first) those whose adapter is ready; arrival order in
        each."""
        keyed: list[list[tuple[tuple[bool, bool, bool, float, int], QueuedRequest]]] = [
            [] for _ in range(self.num_queues)
        ]
        payers = self._adapter_payers(waiting)
        for request in waiting:
            tracked = self._tracked[request.request_id]
            adapter_charge = tracked.sample.adapter_tokens if request.request_id in payers else 0
            queued = QueuedRequest(
                request_id=request.request_id,
                arrival_time=request.arrival_time,
                charge_tokens=0 if tracked.is_charged else self._need(tracked.sample) + adapter_charge,
                adapter_tokens=tracked.sample.adapter_tokens,
                is_adapter_ready=request.adapter_id is None or request.adapter_residency in READY_RESIDENCIES,
                predicted_run_s=seconds_per_token * request.num_predicted_output_tokens,
                is_aged=self._age_bound_s is not None
                and self._waited(request.arrival_time) >= self._age_bound_s,
            )
            is_cold = self.sizing.is_ready_first and not queued.is_adapter_ready and not queued.is_aged
            key = (
                not tracked.is_charged,
                not queued.is_aged,
                is_cold,
                request.arrival_time,
                tracked.seen_order,
            )
            keyed[tracked.queue].append((key, queued))
        return [[queued for _, queued in sorted(members, key=lambda m: m[0])] for members in keyed]

    def _adapter_payers(self, waiting: Sequence[WaitingRequest]) -> frozenset[str]:
        """Held adapters charged once, unified pool, quotas in tokens: the waiting requests that bring an adapter
        no admitted request holds (the oldest of each), whose admission charges that adapter once; else none."""
        if not self.sizing.is_adapter_held_once or self._is_slot_bound or not self._is_adapter_memory_shared:
            return frozenset()
        held = (adapter_id for adapter_id, _ in self._held_adapters())
        return first_payers([(r.request_id, r.adapter_id, r.arrival_time) for r in waiting], held)

    def _running(self, seconds_per_token: float) -> list[RunningRequest]:
        """Admitted requests still running, with their predicted remaining time."""
        running = []
        for tracked in self._tracked.values():
            if tracked.is_running and tracked.admitted_at is not None:
                finish = tracked.admitted_at + seconds_per_token * tracked.sample.shape.num_output_tokens
                returned = (
                    tracked.sample.need_tokens
                    if self._is_adapter_memory_shared
                    else tracked.sample.adapter_tokens
                )
                running.append(RunningRequest(max(0.0, finish - self._now), returned))
        return running
