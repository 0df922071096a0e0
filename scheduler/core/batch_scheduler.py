"""Continuous batching: every step mixes decodes and (chunked) prefills under a token budget.

Running sequences go first (oldest first): each takes its next token or its next prompt chunk. When a
running sequence needs a KV page and none is free, unreferenced cached prefix blocks are evicted (leaves,
LRU), then adapters holding KV-addressable pages that no running request uses, then the youngest running
sequence is preempted (pages freed, recomputed later). Then waiting requests are admitted in the order a
`BatchPolicy` (scheduler/batch_policy.py) decides, while sequences, tokens and pages last; a request whose
adapter is only on the host gets an adapter load planned before its first step (evicting idle adapters,
then adapters only waiting requests use). A request that does not fit waits.

With a `PrefixCache`, an admitted request starts from the longest cached chain of full blocks of its
adapter that prefixes its tokens (only the rest costs token budget), and its computed full prompt blocks
join the cache as they complete (seen at the next `schedule()`, or when it finishes or is preempted).
An adapter leaving the device takes its cached blocks with it (`AdapterResidency.on_leave_device`).
`schedule()` returns a plain `StepPlan`; the engine carries it out.
"""

from __future__ import annotations

from scheduler.batch_policy import BatchBudget, BatchPolicy, WaitingRequest
from scheduler.core.adapter_residency import AdapterResidency, Residency
from scheduler.core.page_pool import PagePool
from scheduler.core.prefix_cache import PrefixCache
from scheduler.core.sequence import BatchEntry, Sequence, SequenceStatus
from scheduler.core.step_plan import AdapterLoad, StepPlan


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
    ) -> None:
        self.pool = pool
        self.residency = residency
        self.policy = policy
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: dict[str, Sequence] = {}
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.prefix_cache = prefix_cache
        if prefix_cache is not None:
            residency.on_leave_device.append(prefix_cache.drop_adapter)

    # ---- queue management ---------------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence; its adapter (if any) must be registered with the residency."""
        if seq.adapter_id is not None:
            self.residency.pin(seq.adapter_id)
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
        cache = self.prefix_cache
        return self.pool.num_free_blocks + (cache.num_evictable_blocks if cache is not None else 0)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Mark finished, free its pages (computed full prompt blocks stay cached), unpin its adapter and drop
        it from the queues."""
        if reason != "error":
            self._cache_computed(seq)
        if seq.adapter_id is not None and not seq.is_finished:
            self.residency.unpin(seq.adapter_id, is_running=seq.status is SequenceStatus.RUNNING)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self.waiting.pop(seq.request_id, None)
        if seq in self.running:
            self.running.remove(seq)
        self._free_blocks(seq)
        self.policy.on_finished(seq.request_id)

    def _free_blocks(self, seq: Sequence) -> None:
        """Release seq's cached blocks and free its own pages."""
        if seq.num_cached_blocks:
            assert self.prefix_cache is not None
            self.prefix_cache.release(seq.block_table[:seq.num_cached_blocks])
        if seq.block_table:
            self.pool.free(seq.block_table[seq.num_cached_blocks:])
            seq.block_table = []
        seq.num_cached_blocks = 0

    def _cache_computed(self, seq: Sequence) -> None:
        """Hand seq's computed full prompt blocks to the prefix cache (seq keeps a reference to each)."""
        cache = self.prefix_cache
        if cache is None or seq.is_finished:
            return
        num_full = min(seq.num_computed_tokens, seq.num_prompt_tokens) // self.pool.block_size
        if num_full > seq.num_cached_blocks:
            seq.num_cached_blocks = cache.insert(
                seq.adapter_id, seq.token_ids, seq.block_table, seq.num_cached_blocks, num_full
            )

    def _reuse_cached_prefix(self, seq: Sequence) -> None:
        """Start a waiting seq from the longest cached prefix of its adapter (at least one token stays)."""
        if self.prefix_cache is None:
            return
        pages = self.prefix_cache.match(seq.adapter_id, seq.token_ids)
        self.prefix_cache.acquire(pages)
        seq.block_table = list(pages)
        seq.num_cached_blocks = len(pages)
        seq.num_computed_tokens = len(pages) * self.pool.block_size

    # ---- one step -----------------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        """Pick this step's work: entries (sorted by adapter), adapter loads/evictions and preemptions."""
        plan = StepPlan()
        budget = self.max_num_batched_tokens
        is_preempted = False
        for seq in self.running:
            self._cache_computed(seq)
        for seq in list(self.running):
            if seq not in self.running or budget == 0:
                continue
            num_new = min(seq.num_uncomputed_tokens, budget)
            if not self._grow_or_preempt(seq, num_new, plan):
                is_preempted = True
                continue
            plan.entries.append(BatchEntry(seq, num_new))
            budget -= num_new
        if not is_preempted:
            self._admit_waiting(plan, budget)
        plan.entries.sort(key=lambda e: e.seq.adapter_id or "")
        return plan

    def _grow_or_preempt(self, seq: Sequence, num_new: int, plan: StepPlan) -> bool:
        """Give `seq` pages for num_new more tokens, preempting the youngest others; False if seq itself went."""
        while not self._append_slots(seq, num_new, plan):
            victim = self.running[-1]
            self._preempt(victim)
            plan.preemptions.append(victim.request_id)
            if victim is seq:
                return False
        return True

    def _append_slots(self, seq: Sequence, num_new: int, plan: StepPlan) -> bool:
        """Grow seq's block table (evicting unreferenced cached blocks, then idle adapters from
        KV-addressable pages, if needed)."""
        num_tokens_after = seq.num_computed_tokens + num_new
        if self.pool.append_slots(seq.block_table, num_tokens_after) is not None:
            return True
        num_missing = self.pool.num_blocks_for_tokens(num_tokens_after) - len(seq.block_table)
        if self.prefix_cache is not None and self.prefix_cache.num_evictable_blocks:
            self.prefix_cache.evict_leaves(num_missing - self.pool.num_free_blocks)
            if self.pool.append_slots(seq.block_table, num_tokens_after) is not None:
                return True
        evicted = self.residency.evict_for_kv(num_missing, keep=seq.adapter_id)
        if not evicted:
            return False
        plan.adapter_evictions.extend(evicted)
        return self.pool.append_slots(seq.block_table, num_tokens_after) is not None

    def _preempt(self, seq: Sequence) -> None:
        """Free a running sequence's pages and put it back to waiting (its KV is recomputed later, but its
        computed full prompt blocks stay cached while nothing needs their room)."""
        self._cache_computed(seq)
        self.running.remove(seq)
        self._free_blocks(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        if seq.adapter_id is not None:
            self.residency.unpin(seq.adapter_id, is_running=True)
            self.residency.pin(seq.adapter_id)
        self.waiting = {seq.request_id: seq, **self.waiting}

    def _admit_waiting(self, plan: StepPlan, budget: int) -> None:
        """Admit waiting sequences in policy order while sequences, tokens, adapter room and pages last."""
        if not self.waiting or budget == 0 or len(self.running) >= self.max_num_seqs:
            return
        admission = self.policy.plan(
            [self.describe(s) for s in self.waiting.values()],
            BatchBudget(
                num_free_seqs=self.max_num_seqs - len(self.running),
                num_free_tokens=budget,
                num_free_blocks=self.num_reclaimable_blocks(),
                block_size=self.pool.block_size,
            ),
        )
        for request_id in admission.request_ids:
            if budget == 0 or len(self.running) >= self.max_num_seqs:
                break
            seq = self.waiting[request_id]
            if not self._plan_adapter(seq, plan):
                if admission.is_head_of_line_blocking:
                    break
                continue
            self._reuse_cached_prefix(seq)
            num_new = min(seq.num_uncomputed_tokens, budget)
            if not self._append_slots(seq, num_new, plan):
                self._free_blocks(seq)
                seq.num_computed_tokens = 0
                if admission.is_head_of_line_blocking:
                    break
                continue
            if self.prefix_cache is not None:
                self.prefix_cache.record_query(seq.num_tokens, seq.num_computed_tokens)
            self._admit(seq)
            plan.entries.append(BatchEntry(seq, num_new))
            budget -= num_new

    def _admit(self, seq: Sequence) -> None:
        del self.waiting[seq.request_id]
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        if seq.adapter_id is not None:
            self.residency.unpin(seq.adapter_id)
            self.residency.pin(seq.adapter_id, is_running=True)

    def _plan_adapter(self, seq: Sequence, plan: StepPlan) -> bool:
        """Make sure seq's adapter is (or will be, before this step runs) on the device; False if no room.

        CPU-assisted prefill plugs in here: a request could run while its adapter is COPYING, with the
        LoRA delta computed from the host copy until the copy lands (the engine then needs the plan to say
        which entries use a host copy).
        """
        if seq.adapter_id is None:
            return True
        return self.plan_adapter_load(seq.adapter_id, may_evict_waiting=True, plan=plan)

    def plan_adapter_load(self, adapter_id: str, may_evict_waiting: bool, plan: StepPlan) -> bool:
        """Add the evictions and the load that put a registered adapter on the device to `plan`.

        True when it is (or will be) on the device; False when there is no room (nothing changes). Also
        used outside `schedule()` for an explicit load (a worker's prefetch), with may_evict_waiting False.
        """
        residency = self.residency.residency(adapter_id)
        if residency is Residency.NONE:
            return False
        state = self.residency.get(adapter_id)
        victims = self.residency.plan_load(adapter_id, may_evict_waiting)
        if victims is None:
            return False
        plan.adapter_evictions.extend(victims)
        if residency is Residency.HOST:
            plan.adapter_loads.append(AdapterLoad(adapter_id, state.host_path if state else None))
        return True

    def on_adapter_loaded(self, adapter_id: str) -> None:
        """The engine finished a planned load."""
        self.residency.mark_loaded(adapter_id)

    def on_adapter_load_failed(self, adapter_id: str) -> list[Sequence]:
        """A planned load failed: release its pages; returns the unfinished sequences using it."""
        self.residency.cancel_load(adapter_id)
        return [s for s in (*self.waiting.values(), *self.running) if s.adapter_id == adapter_id]

    def describe(self, seq: Sequence) -> WaitingRequest:
        """What the batch policy sees of a waiting sequence."""
        state = self.residency.get(seq.adapter_id) if seq.adapter_id is not None else None
        return WaitingRequest(
            request_id=seq.request_id,
            arrival_time=seq.arrival_time,
            num_prompt_tokens=seq.num_tokens,
            max_tokens=seq.max_tokens,
            adapter_id=seq.adapter_id,
            adapter_rank=state.rank if state is not None else 0,
            predicted_output_tokens=(
                seq.max_tokens if seq.predicted_output_tokens is None else seq.predicted_output_tokens
            ),
            adapter_num_bytes=state.num_bytes if state is not None else 0,
            adapter_residency=state.residency.value if state is not None else Residency.NONE.value,
        )
