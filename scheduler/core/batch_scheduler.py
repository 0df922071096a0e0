"""Continuous batching: every step mixes decodes and (chunked) prefills under a token budget.

Running sequences go first (oldest first): each takes its next token or its next prompt chunk. When a
running sequence needs a KV page and none is free, unreferenced cached prefix blocks are evicted (leaves,
LRU), then adapters holding KV-addressable pages that no running request uses, then the youngest running
sequence is preempted (pages freed, recomputed later); a sequence's pages are `core/sequence_blocks.py`'s.
Then waiting requests are admitted in the order a `BatchPolicy` (scheduler/admission/batch_policy.py)
decides, while sequences, tokens and pages last, and, when `max_running_tokens` is set, while the running
batch's tokens stay within it, and, when `max_running_adapter_bytes` is set, while its distinct adapters'
bytes do (scheduler/admission/running_budget.py); a request whose adapter is only on the host gets an
adapter copy planned (evicting idle adapters, then adapters only waiting requests use, each class in the
residency's eviction policy order; in a unified pool, moving KV pages out of its run first). A request
that does not fit waits; with the plan's head-of-line blocking, the requests after it wait too (all of them,
or only those of its group when the plan has groups; `core/admission_gate.py`). The policy hears of each
actual admission (`on_admitted`) and finish (`on_finished`), timed on the scheduler's `clock`, and of the
output tokens each planned step computes per request (`on_tokens_served`: fair share,
scheduler/admission/fair_share.py). Without the adapter cache (`AdapterResidency.is_caching_idle_adapters`
False) each step starts by evicting the adapters no request uses any more. While its adapter is PREPARING
(its host copy is read, validated and packed off the step loop) a sequence waits; while it is COPYING, it
runs only as a CPU-assisted prefill (`CopyGate`, at most `num_cpu_prefill_workers` entries; decodes wait
for the copy). Then adapters of waiting requests are prefetched (see `_prefetch`).

With a `PrefixCache`, an admitted request starts from the longest cached chain of full blocks of its
adapter, in its cache namespace (`Sequence.cache_namespace`: its tenant's own unless an operator shares one),
that prefixes its tokens (only the rest costs token budget), and its computed full prompt blocks join the
cache as they complete (seen at the next `schedule()`, or when it finishes or is preempted).
An adapter leaving the device takes its cached blocks with it (`AdapterResidency.on_leave_device`).
`schedule()` returns a plain `StepPlan`; the engine carries it out and hands the sampled tokens to
`update_from_output` (core/step_output.py: computed tokens, appended tokens, stops, times). Loads are
asynchronous: which sequences of an adapter still being loaded run is `core/copy_gate.py`'s decision
(CPU-assisted prefills). Multi-step windows (one plan for several steps): `core/multi_step.py`.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Collection

from scheduler.admission.admission import BatchBudget, BatchPolicy
from scheduler.admission.running_budget import RunningBudget
from scheduler.core.adapter_residency import AdapterResidency, Residency
from scheduler.core.admission_gate import AdmissionGate
from scheduler.core.copy_gate import CopyGate
from scheduler.core.multi_step import DecodeWindow
from scheduler.core.page_pool import PagePool
from scheduler.core.prefix_cache import PrefixCache
from scheduler.core.scheduler_stats import SchedulerStats, make_stats
from scheduler.core.sequence import Sequence, SequenceStatus
from scheduler.core.sequence_blocks import SequenceBlocks
from scheduler.core.step_output import StepUpdate, TextStop, update_from_output
from scheduler.core.step_plan import AdapterLoad, StepPlan
from scheduler.core.waiting_view import describe_waiting


class BatchScheduler:
    """Owns the waiting and running queues, the sequences' KV pages and the adapters' pins."""

    def __init__(
        self,
        pool: PagePool,
        residency: AdapterResidency,
        policy: BatchPolicy,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        prefix_cache: PrefixCache | None = None,
        num_cpu_prefill_workers: int = 0,
        clock: Callable[[], float] = time.time,
        eos_token_ids: Collection[int] = frozenset(),
        max_running_tokens: int | None = None,
        max_num_steps: int = 1,
        max_running_adapter_bytes: int | None = None,
    ) -> None:
        """`clock`: the clock of `Sequence.arrival_time` (wall time by default; the residency's clock too);
        the policy sees its reading as `BatchBudget.now` and as the admission and finish times of requests.
        `eos_token_ids`: the model's end-of-sequence tokens (a stop unless a request sets `ignore_eos`).
        `max_running_tokens`, `max_running_adapter_bytes`: the running batch's bounds on its tokens and on its
        distinct adapters' bytes (scheduler/admission/running_budget.py; None: none).
        `max_num_steps`: the most engine steps one plan of decodes runs (core/multi_step.py; 1: a plan per step)."""
        self.pool = pool
        self.residency = residency
        self.policy = policy
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.running_budget = RunningBudget(max_running_tokens, max_running_adapter_bytes)
        self.waiting: dict[str, Sequence] = {}
        self.running: list[Sequence] = []
        self.version = 0  # bumped when the queues may change: add, finish, every full plan
        self.copy_gate = CopyGate(residency, num_cpu_prefill_workers)
        self.clock = clock
        self.eos_token_ids = frozenset(eos_token_ids)
        self.num_preemptions = 0
        self.window = DecodeWindow(max_num_steps)  # the open multi-step window (core/multi_step.py)
        self._admission_order: list[str] = []  # this step's batch policy order (for prefetch)
        self.num_adapter_hits = 0  # admissions whose adapter needed no load (on the device or loading)
        self.num_adapter_misses = 0  # admissions that planned their adapter's load
        # request id -> whether its adapter was on the device (or loading) when admission first tried it
        self._is_hit_at_first_try: dict[str, bool] = {}
        self.num_adapter_prefetches = 0  # loads planned for waiting requests before their admission
        self.prefix_cache = prefix_cache
        self.blocks = SequenceBlocks(
            pool, residency, prefix_cache, lambda: [*self.running, *self.waiting.values()]
        )

    # ---- queue management ---------------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence; its adapter (if any) must be registered with the residency."""
        self.window.close()
        self.version += 1
        if seq.adapter_id is not None:
            self.residency.pin(seq.adapter_id)
            self.residency.record_access(seq.adapter_id)
        self.waiting[seq.request_id] = seq

    def has_unfinished(self) -> bool:
        """True while any sequence waits or runs."""
        return bool(self.waiting or self.running)

    def get(self, request_id: str) -> Sequence | None:
        """The unfinished sequence with this id, if any."""
        seq = self.waiting.get(request_id)
        if seq is not None:
            return seq
        return next((s for s in self.running if s.request_id == request_id), None)

    def is_adapter_in_use(self, adapter_id: str) -> bool:
        """True when a waiting or running sequence, or a lease, pins the adapter."""
        state = self.residency.get(adapter_id)
        return state is not None and state.is_pinned

    def num_reclaimable_blocks(self) -> int:
        """KV pages a new sequence could get: free ones plus unreferenced cached blocks."""
        return self.blocks.num_reclaimable_blocks()

    def make_stats(self) -> SchedulerStats:
        """The core's counters and state now: queues, pages, residency, the router's inputs."""
        return make_stats(self)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Mark finished, free its pages (computed full prompt blocks stay cached), unpin its adapter and drop
        it from the queues."""
        self.window.close()
        self.version += 1
        if reason != "error":
            self.blocks.cache_computed(seq)
        if seq.adapter_id is not None and not seq.is_finished:
            self.residency.unpin(seq.adapter_id, is_running=seq.status is SequenceStatus.RUNNING)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self.waiting.pop(seq.request_id, None)
        self.copy_gate.forget(seq.request_id)
        self._is_hit_at_first_try.pop(seq.request_id, None)
        if seq in self.running:
            self.running.remove(seq)
        self.blocks.free(seq)
        self.policy.on_finished(seq.request_id, now=self.clock())

    # ---- one step -----------------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        """Pick this step's work: entries (sorted by adapter), adapter loads/evictions and preemptions; the
        open multi-step window's plan again while it lasts (core/multi_step.py)."""
        if self.window.next_plan(self.running, self.pool) is not None:
            return self.window.count_steps(self.residency, self.policy, [self.clock()])
        plan = self._plan_step()
        self.window.open(plan, self.running, len(self.waiting))
        return plan

    def advance_window(self, step_starts: list[float]) -> StepPlan:
        """Take one step of the open window per planning time in `step_starts` at once (core/multi_step.py),
        as that many `schedule()` calls would: pages, batch sizes, tokens served; returns its plan."""
        self.window.take_steps(self.running, self.pool, len(step_starts))
        return self.window.count_steps(self.residency, self.policy, step_starts)

    def _plan_step(self) -> StepPlan:
        """One step's plan in full: running sequences first, then admissions and prefetches."""
        plan = StepPlan(start_time=self.clock())
        self.version += 1  # admissions and preemptions happen here
        plan.adapter_evictions.extend(self.residency.drop_idle_adapters())  # no-op with the adapter cache
        budget = self.max_num_batched_tokens
        is_preempted = False
        for seq in self.running:
            self.blocks.cache_computed(seq)
        for seq in list(self.running):
            if seq.status is not SequenceStatus.RUNNING or budget == 0:  # preempted above (not in running)
                continue
            if not self.copy_gate.may_run(seq, plan):
                continue
            num_new = min(seq.num_uncomputed_tokens, budget)
            if not self._grow_or_preempt(seq, num_new, plan):
                is_preempted = True
                continue
            self.copy_gate.add_entry(plan, seq, num_new)
            budget -= num_new
        is_memory_short = is_preempted or self._admit_waiting(plan, budget)
        if not is_memory_short:
            self._prefetch(plan)
        if plan.entries:
            self.residency.record_batch_size(len(plan.entries))
        plan.entries.sort(key=lambda e: e.seq.adapter_id or "")
        self.policy.on_tokens_served(plan.num_output_tokens_by_request())
        return plan

    def update_from_output(
        self, plan: StepPlan, sampled: list[int | None], now: float, text_stop: TextStop | None = None
    ) -> StepUpdate:
        """After the step of `plan`: compute its tokens, append `sampled` (one per sampling entry of
        `plan.runnable_entries()`, None for a failed row) and finish the stopped sequences (core/step_output.py)."""
        return update_from_output(plan, sampled, now, self.finish, self.eos_token_ids, text_stop)

    def _grow_or_preempt(self, seq: Sequence, num_new: int, plan: StepPlan) -> bool:
        """Give `seq` pages for num_new more tokens, preempting the youngest others; False if seq itself went."""
        while not self.blocks.append_slots(seq, num_new, plan):
            victim = self.running[-1]
            self._preempt(victim)
            plan.preemptions.append(victim.request_id)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        """Free a running sequence's pages and put it back to waiting (its KV is recomputed later, but its
        computed full prompt blocks stay cached while nothing needs their room)."""
        self.blocks.cache_computed(seq)
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        if seq.adapter_id is not None:
            self.residency.unpin(seq.adapter_id, is_running=True)
            self.residency.pin(seq.adapter_id)
        self.waiting = {seq.request_id: seq, **self.waiting}

    def _admit_waiting(self, plan: StepPlan, budget: int) -> bool:
        """Admit waiting sequences in policy order while sequences, tokens, adapter room and pages last;
        True when a request was left waiting for lack of pages (adapter or KV)."""
        self._admission_order = []
        if not self.waiting or budget == 0 or len(self.running) >= self.max_num_seqs:
            return False
        admission = self.policy.plan(
            [describe_waiting(s, self.residency) for s in self.waiting.values()],
            BatchBudget(
                num_free_seqs=self.max_num_seqs - len(self.running),
                num_free_tokens=budget,
                num_free_blocks=self.num_reclaimable_blocks(),
                block_size=self.pool.block_size,
                now=self.clock(),
                num_total_blocks=self.pool.num_blocks,
                num_bytes_per_block=self.residency.page_bytes,
                max_num_seqs=self.max_num_seqs,
                is_adapter_memory_shared=self.pool.is_unified,
                max_running_tokens=self.running_budget.max_running_tokens or 0,
            ),
        )
        self._admission_order = list(admission.request_ids)
        gate = AdmissionGate(admission)
        is_memory_short = False
        num_running_tokens = sum(s.num_tokens for s in self.running)
        running_adapters = {s.adapter_id for s in self.running if s.adapter_id is not None}
        num_running_adapter_bytes = sum(self._adapter_bytes(a) for a in running_adapters)
        for request_id in admission.request_ids:
            if budget == 0 or len(self.running) >= self.max_num_seqs or gate.is_closed:
                break
            if not gate.may_try(request_id):
                continue
            seq = self.waiting[request_id]
            if not self.running_budget.may_admit(num_running_tokens, seq.num_tokens, len(self.running)):
                gate.on_short(request_id, is_adapter_short=False)  # the batch is full: not a memory shortage
                continue
            is_new_adapter = seq.adapter_id is not None and seq.adapter_id not in running_adapters
            if is_new_adapter and not self.running_budget.may_add_adapter(
                num_running_adapter_bytes, self._adapter_bytes(seq.adapter_id), len(running_adapters)
            ):
                # the batch's adapters are full: waits its turn
                gate.on_short(request_id, is_adapter_short=False)
                continue
            # a request that waits for the load it planned is still a miss when it is admitted later
            is_hit = self._is_hit_at_first_try.setdefault(
                request_id, self.residency.is_reserved(seq.adapter_id)
            )
            if not self._plan_adapter(seq, plan):
                is_memory_short = True
                gate.on_short(request_id, is_adapter_short=True)
                continue
            if not self.copy_gate.may_run(seq, plan):
                continue  # its adapter's copy is under way: not a shortage, so it blocks nobody behind it
            self.blocks.reuse_cached_prefix(seq)
            num_new = min(seq.num_uncomputed_tokens, budget)
            if not self.blocks.append_slots(seq, num_new, plan):
                self.blocks.free(seq)
                seq.num_computed_tokens = 0
                is_memory_short = True
                gate.on_short(request_id, is_adapter_short=False)
                continue
            if self.prefix_cache is not None:
                self.prefix_cache.record_query(seq.num_tokens, seq.num_computed_tokens)
            self._admit(seq)
            self._count_adapter_access(seq, is_hit)
            self.copy_gate.add_entry(plan, seq, num_new)
            budget -= num_new
            num_running_tokens += seq.num_tokens
            if is_new_adapter and seq.adapter_id is not None:
                running_adapters.add(seq.adapter_id)
                num_running_adapter_bytes += self._adapter_bytes(seq.adapter_id)
        return is_memory_short

    def _adapter_bytes(self, adapter_id: str | None) -> int:
        state = self.residency.get(adapter_id) if adapter_id is not None else None
        return state.num_bytes if state is not None else 0

    def _count_adapter_access(self, seq: Sequence, is_hit: bool) -> None:
        self._is_hit_at_first_try.pop(seq.request_id, None)
        is_counted = seq.adapter_id is not None  # base-model requests are neither
        self.num_adapter_hits += is_counted and is_hit
        self.num_adapter_misses += is_counted and not is_hit

    def _prefetch(self, plan: StepPlan) -> None:
        """Plan loads for the adapters of waiting requests, in the batch policy's order, before admission.

        The order is this step's admission order, then the waiting requests the policy left out of it (a
        multi-queue plans only what its quotas cover) in queue order; the first `max_num_seqs` of them. A
        prefetch evicts idle adapters only (in the eviction policy's order: a queued request's known next use
        outranks an idle adapter's possible reuse), never one that a running or waiting request uses, and
        leaves one free KV page per running sequence (its next decode block). Skipped in a step short of
        pages (a preemption, or a request left waiting for pages): the cache grows only while memory is idle.
        """
        planned = {rid: None for rid in self._admission_order if rid in self.waiting}
        left_out = (rid for rid in self.waiting if rid not in planned)  # lazily: a backlog can be long
        for request_id in itertools.islice(itertools.chain(planned, left_out), self.max_num_seqs):
            adapter_id = self.waiting[request_id].adapter_id
            if adapter_id is None or self.residency.residency(adapter_id) is not Residency.HOST:
                continue
            if self.plan_adapter_load(
                adapter_id, may_evict_waiting=False, plan=plan, min_free_kv_blocks=len(self.running)
            ):
                self.num_adapter_prefetches += 1

    def _admit(self, seq: Sequence) -> None:
        del self.waiting[seq.request_id]
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        self.policy.on_admitted(seq.request_id, now=self.clock())
        if seq.adapter_id is not None:
            self.residency.unpin(seq.adapter_id)
            self.residency.pin(seq.adapter_id, is_running=True)

    def _plan_adapter(self, seq: Sequence, plan: StepPlan) -> bool:
        """Make sure seq's adapter is on the device or being copied there; False if no room.

        Whether seq may run while its adapter is being loaded is the copy gate's call (`CopyGate.may_run`).
        """
        if seq.adapter_id is None:
            return True
        return self.plan_adapter_load(seq.adapter_id, may_evict_waiting=True, plan=plan)

    def plan_adapter_load(
        self, adapter_id: str, may_evict_waiting: bool, plan: StepPlan, min_free_kv_blocks: int = 0
    ) -> bool:
        """Add the evictions and the load that put a registered adapter on the device to `plan`.

        True when it is (or will be) on the device; False when there is no room (nothing changes). Also
        used outside `schedule()` for an explicit load (a worker's prefetch), with may_evict_waiting False.
        `min_free_kv_blocks`: KV pages that must stay free after the load.
        """
        self.window.close()
        residency = self.residency.residency(adapter_id)
        if residency is Residency.NONE:
            return False
        state = self.residency.get(adapter_id)
        victims = self.residency.plan_load(adapter_id, may_evict_waiting, min_free_kv_blocks)
        if victims is None and may_evict_waiting and self.blocks.drop_cached_blocks_for_adapters():
            victims = self.residency.plan_load(adapter_id, may_evict_waiting, min_free_kv_blocks)
        if victims is None:
            return False
        plan.adapter_evictions.extend(victims)
        plan.add_kv_block_moves(self.blocks.take_moves())
        if residency is Residency.HOST:
            plan.adapter_loads.append(AdapterLoad(adapter_id, state.host_path if state else None))
        return True

    def on_adapter_prepared(self, adapter_id: str) -> None:
        """A planned load's host copy is ready (PREPARING -> COPYING): its copy to the device runs, and its
        prefills may run on the host copy meanwhile (CPU-assisted)."""
        self.window.close()
        self.residency.mark_prepared(adapter_id)

    def on_adapter_loaded(self, adapter_id: str, load_seconds: float | None = None) -> None:
        """A planned copy landed on the device (in `load_seconds`, when measured); from then on its sequences
        use the device copy."""
        self.window.close()
        self.residency.mark_loaded(adapter_id, load_seconds)

    def on_adapter_load_failed(self, adapter_id: str) -> list[Sequence]:
        """A planned load failed: release its pages; returns the unfinished sequences using it."""
        self.window.close()
        self.residency.cancel_load(adapter_id)
        return [s for s in (*self.waiting.values(), *self.running) if s.adapter_id == adapter_id]
