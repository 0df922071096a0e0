"""Continuous batching: every step mixes decodes and (chunked) prefills under a token budget.

Running sequences go first (oldest first): each takes its next token or its next prompt chunk. When a
running sequence needs a KV page and none is free, the youngest running sequence is preempted (pages freed,
recomputed later). Then waiting requests are admitted in the order a `BatchPolicy` (scheduler/) decides,
while sequences, tokens and pages last. A request that does not fit waits; nothing crashes.
"""

from __future__ import annotations

from collections.abc import Callable

from gpu_workers.block_manager import BlockManager
from gpu_workers.model_runner import BatchEntry
from gpu_workers.sequence import Sequence, SequenceStatus
from scheduler.batch_policy import BatchBudget, BatchPolicy, WaitingRequest


class BatchScheduler:
    """Owns the waiting and running queues and the sequences' KV pages."""

    def __init__(
        self,
        block_manager: BlockManager,
        policy: BatchPolicy,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        adapter_rank: Callable[[str | None], int] = lambda _: 0,
    ) -> None:
        self.block_manager = block_manager
        self.policy = policy
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.adapter_rank = adapter_rank
        self.waiting: dict[str, Sequence] = {}
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    # ---- queue management ---------------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence."""
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
        """True when a waiting or running sequence uses the adapter (it is pinned)."""
        return any(s.adapter_id == adapter_id for s in (*self.waiting.values(), *self.running))

    def finish(self, seq: Sequence, reason: str) -> None:
        """Mark finished, free its pages and drop it from the queues."""
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self.waiting.pop(seq.request_id, None)
        if seq in self.running:
            self.running.remove(seq)
        self._free_blocks(seq)
        self.policy.on_finished(seq.request_id)

    def _free_blocks(self, seq: Sequence) -> None:
        if seq.block_table:
            self.block_manager.free(seq.block_table)
            seq.block_table = []

    # ---- one step -----------------------------------------------------------------------------------

    def schedule(self) -> list[BatchEntry]:
        """Pick this step's work; entries come back sorted by adapter (tokens of an adapter contiguous)."""
        budget = self.max_num_batched_tokens
        entries: list[BatchEntry] = []
        is_preempted = False
        for seq in list(self.running):
            if seq not in self.running or budget == 0:
                continue
            num_new = min(seq.num_uncomputed_tokens, budget)
            if not self._grow_or_preempt(seq, num_new):
                is_preempted = True
                continue
            entries.append(BatchEntry(seq, num_new))
            budget -= num_new
        if not is_preempted:
            budget = self._admit_waiting(entries, budget)
        entries.sort(key=lambda e: e.seq.adapter_id or "")
        return entries

    def _grow_or_preempt(self, seq: Sequence, num_new: int) -> bool:
        """Give `seq` pages for num_new more tokens, preempting the youngest others; False if seq itself went."""
        while self.block_manager.append_slots(seq.block_table, seq.num_computed_tokens + num_new) is None:
            victim = self.running[-1]
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        """Free a running sequence's pages and put it back to waiting (its KV is recomputed later)."""
        self.running.remove(seq)
        self._free_blocks(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting = {seq.request_id: seq, **self.waiting}

    def _admit_waiting(self, entries: list[BatchEntry], budget: int) -> int:
        """Admit waiting sequences in policy order while sequences, tokens and pages last."""
        if not self.waiting or budget == 0 or len(self.running) >= self.max_num_seqs:
            return budget
        plan = self.policy.plan(
            [self._describe(s) for s in self.waiting.values()],
            BatchBudget(
                num_free_seqs=self.max_num_seqs - len(self.running),
                num_free_tokens=budget,
                num_free_blocks=self.block_manager.num_free_blocks,
                block_size=self.block_manager.block_size,
            ),
        )
        for request_id in plan.request_ids:
            if budget == 0 or len(self.running) >= self.max_num_seqs:
                break
            seq = self.waiting[request_id]
            num_new = min(seq.num_uncomputed_tokens, budget)
            if self.block_manager.append_slots(seq.block_table, seq.num_computed_tokens + num_new) is None:
                if plan.is_head_of_line_blocking:
                    break
                continue
            del self.waiting[request_id]
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            entries.append(BatchEntry(seq, num_new))
            budget -= num_new
        return budget

    def _describe(self, seq: Sequence) -> WaitingRequest:
        return WaitingRequest(
            request_id=seq.request_id,
            arrival_time=seq.arrival_time,
            num_prompt_tokens=seq.num_tokens,
            max_tokens=seq.max_tokens,
            adapter_id=seq.adapter_id,
            adapter_rank=self.adapter_rank(seq.adapter_id),
        )
