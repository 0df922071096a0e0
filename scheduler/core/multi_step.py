"""Multi-step scheduling (vLLM's multi-step, `num_scheduler_steps`): one `StepPlan` of decodes runs for
several engine steps while nothing can change its batch, so `BatchScheduler.schedule()` plans once per window
instead of once per step.

The rule (`num_window_steps`): a plan opens a window of k > 1 steps only when
- no request waits (no admission, prefetch or adapter load can happen) and the plan starts no adapter load,
  evicts nothing, preempts nothing and holds no copy wait or host-assisted entry (every running adapter is on
  the device: no copy can add a row);
- every running sequence is in the plan as a decode (one token, sampling);
- no sequence can finish by length before the window's last step: k <= min over rows of
  (max_tokens - output tokens so far), so a length finish ends the window at its last step.
What the rule cannot know ahead ends the window early, before the next step runs (`BatchScheduler` drops the
window, and the next `schedule()` plans in full): a stop token, stop string or abort (any finish), a request
added, an adapter host copy ready or copy landed, an explicit adapter load, and a KV page the pool cannot give
(`grow_for_next_step`: pages are taken step by step in running order, as a plan per step takes them, never
reserved ahead, so page ids, evictions and preemptions are those of single-step scheduling).

Within a window each step does what `schedule()` does for such a batch and nothing else: grow the block
tables that cross a block boundary, count the batch size and the tokens served. So a window changes no
result: the tokens, times and pages are those of one plan per step (tests/scheduler/core/test_multi_step.py);
the engine calls `step()` once per engine step as before, so a request that arrives mid-window ends it and is
admitted at the next step, as without windows. What it saves is `schedule()`'s work (admission, policy,
residency and copy checks, sorting) on every step but the first of a window.

Several steps at once: an executor that prices steps without running a model (the twin's,
`scheduler.core.executor.DecodeStepsExecutor`) may run a window's steps in one call up to a horizon (the
simulation's next event) when no token can end a row early (`are_finishes_known`: no stop token, no EOS that
counts, no stop strings; finishes by length are the window's own bound). The core then accounts those steps
at once exactly as one call per step would (`DecodeWindow.take_steps`: the same pages in the same order,
only as many steps as the free pages cover, `num_steps_with_pages`; counters, batch sizes and tokens served
per step; tokens and their times per row), so records stay equal while per-step Python work disappears.
"""

from __future__ import annotations

from collections.abc import Collection

from scheduler.admission.admission import BatchPolicy
from scheduler.core.adapter_residency import AdapterResidency
from scheduler.core.page_pool import PagePool
from scheduler.core.sequence import BatchEntry, Sequence
from scheduler.core.step_plan import StepPlan


def num_window_steps(plan: StepPlan, running: list[Sequence], num_waiting: int, max_steps: int) -> int:
    """How many engine steps `plan` may run unchanged (1: no window; module doc for the rule)."""
    if max_steps <= 1 or num_waiting or not _is_plain(plan) or len(plan.entries) != len(running):
        return 1
    num_steps = max_steps
    for entry in plan.entries:
        seq = entry.seq
        if entry.num_new_tokens != 1 or seq.num_computed_tokens + 1 != len(seq.token_ids):
            return 1
        if seq.num_computed_tokens < seq.num_prompt_tokens:
            return 1  # the prompt's last token: its step samples the first output token
        num_steps = min(num_steps, seq.max_tokens - seq.num_output_tokens)
    return max(num_steps, 1)


def _is_plain(plan: StepPlan) -> bool:
    """True when the plan changes nothing but its rows' tokens (no load, eviction, preemption, copy or KV move)."""
    return not (
        plan.adapter_loads
        or plan.kv_block_moves
        or plan.adapter_evictions
        or plan.preemptions
        or plan.copy_waits
        or plan.host_assisted_adapters
    )


class DecodeWindow:
    """The open window of a `BatchScheduler` (at most `max_num_steps` steps): its plan and the steps it has
    left; `num_opened` counts windows and `num_window_steps` the steps run from an open window's plan (not
    planned in full)."""

    def __init__(self, max_num_steps: int = 1) -> None:
        self.max_num_steps = max_num_steps
        self.plan: StepPlan | None = None
        # the open plan's output tokens per request: one per row at every step (every row decodes, none ends)
        self.served: dict[str, int] = {}
        self.num_steps_left = 0
        self.num_opened = 0
        self.num_window_steps = 0

    @property
    def is_open(self) -> bool:
        """True while the window has steps left."""
        return self.plan is not None and self.num_steps_left > 0

    def open(self, plan: StepPlan, running: list[Sequence], num_waiting: int) -> None:
        """A plan planned in full runs `num_window_steps` steps (its first now; no window when 1)."""
        plan.num_steps = num_steps = num_window_steps(plan, running, num_waiting, self.max_num_steps)
        if num_steps > 1:
            self.plan, self.num_steps_left = plan, num_steps - 1
            self.served = plan.num_output_tokens_by_request()
            self.num_opened += 1

    def close(self) -> None:
        """End the window (something changed: the next `schedule()` plans in full)."""
        self.plan, self.num_steps_left = None, 0

    def count_steps(
        self, residency: AdapterResidency, policy: BatchPolicy, step_starts: list[float]
    ) -> StepPlan:
        """What `schedule()` counts for each window step taken, planned at `step_starts`: the batch size (the
        residency's recent batch sizes) and the tokens it serves (the policy's fair share); returns the plan."""
        plan = self.plan
        assert plan is not None, "no window is open"
        residency.record_batch_sizes(len(plan.entries), step_starts)
        for _ in step_starts:
            policy.on_tokens_served(self.served)
        plan.start_time = step_starts[-1]
        return plan

    def take_steps(self, running: list[Sequence], pool: PagePool, num_steps: int) -> None:
        """Take `num_steps` (<= `num_steps_with_pages`) of the window's steps at once, before the rows' tokens
        are applied: the pages they need in the order one step at a time takes them (step, then running
        order)."""
        block_size = pool.block_size
        crossings: list[tuple[int, int]] = []
        for index, seq in enumerate(running):
            # step i (1-based) needs room for num_computed + i tokens; the first step past the table's room
            first = len(seq.block_table) * block_size - seq.num_computed_tokens + 1
            crossings.extend((step, index) for step in range(max(first, 1), num_steps + 1, block_size))
        for step, index in sorted(crossings):
            seq = running[index]
            if pool.append_slots(seq.block_table, seq.num_computed_tokens + step) is None:
                raise RuntimeError("take_steps beyond the free pages (num_steps_with_pages bounds it)")
        self.num_steps_left -= num_steps
        self.num_window_steps += num_steps

    def next_plan(self, running: list[Sequence], pool: PagePool) -> StepPlan | None:
        """The window's plan for its next step, its rows' next KV slots taken; None (the window closed) when
        none is open, it is used up or a row's page cannot be had."""
        plan = self.plan
        if plan is None:
            return None
        if self.num_steps_left <= 0 or not grow_for_next_step(running, pool):
            self.close()
            return None
        self.num_steps_left -= 1
        self.num_window_steps += 1
        return plan


def grow_for_next_step(running: list[Sequence], pool: PagePool) -> bool:
    """Give every running sequence the KV slot of its next decode token, in running order (a page when it
    crosses a block boundary); False at the first one the pool cannot serve (the pages taken so far stay:
    the full `schedule()` that follows takes the same ones first)."""
    block_size = pool.block_size
    for seq in running:
        num_after = seq.num_computed_tokens + 1
        if (
            len(seq.block_table) * block_size < num_after
            and pool.append_slots(seq.block_table, num_after) is None
        ):
            return False
    return True


def num_steps_with_pages(running: list[Sequence], pool: PagePool, max_steps: int) -> int:
    """The most steps (<= max_steps, from the rows' state now) whose new KV pages the free pool covers."""
    block_size, num_free = pool.block_size, pool.num_free_blocks
    # a row's table holds its computed tokens, so k steps need at most ceil(k / block_size) new pages a row
    if len(running) * -(-max_steps // block_size) <= num_free:
        return max_steps
    rows = [(len(s.block_table), s.num_computed_tokens) for s in running]

    def num_needed(num_steps: int) -> int:
        return sum(max(0, -(-(done + num_steps) // block_size) - have) for have, done in rows)

    if num_needed(max_steps) <= num_free:
        return max_steps
    low, high = 0, max_steps
    while low < high:  # num_needed grows with the steps: the largest that fits
        mid = (low + high + 1) // 2
        if num_needed(mid) <= num_free:
            low = mid
        else:
            high = mid - 1
    return low


def are_finishes_known(
    entries: list[BatchEntry], eos_token_ids: Collection[int], has_text_stop: bool
) -> bool:
    """True when no sampled token can end a row: no stop strings, and no row has stop tokens or counts an EOS
    id (only `max_tokens` ends them, which the window's length bounds)."""
    if has_text_stop:
        return False
    for entry in entries:
        params = entry.seq.sampling_params
        if params.stop_token_ids or (eos_token_ids and not params.ignore_eos):
            return False
    return True
