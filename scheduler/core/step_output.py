"""The update after a step (`BatchScheduler.update_from_output`): what the executor's sampled tokens do to the
sequences of the plan it carried out.

Every entry's tokens become computed; each sampling entry's sequence gets its sampled token appended and
is checked for a stop, in this order: a stop token (`SamplingParams.stop_token_ids`, or the model's EOS
ids unless `ignore_eos`) ends it with "stop" before the token is shown as text; then the caller's
`TextStop` (the engine detokenizes and looks for stop strings) may end it with "stop" (neither while
`SamplingParams.min_tokens` holds stops back: `is_stop_held`); then reaching
`Sequence.max_tokens` ends it with "length". Times come from the caller: `StepPlan.start_time` stamps
`first_scheduled_time` (its queueing ends when the step starts), `now` (the step's end) stamps
`first_token_time` and `finish_time`.

A sampling entry whose token is None (the executor could not sample it, e.g. non-finite logits) gets its
tokens computed but nothing appended, stamped or finished: the caller finishes it with its own error
(`BatchScheduler.finish(seq, "error")`) before the next `schedule()`, since only the caller knows why it failed and
what to tell the tenant.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from scheduler.core.sequence import BatchEntry, Sequence
from scheduler.core.step_plan import StepPlan

TextStop = Callable[[Sequence], bool]
"""Called once per appended token that no stop token ended, before the length check; True ends the
sequence with "stop" (the engine: detokenize the new token, trim the text at a stop string)."""


@dataclass(frozen=True)
class SampledToken:
    """One sampling entry's result: `token_id` None when the executor failed that row."""

    seq: Sequence
    token_id: int | None


@dataclass(frozen=True)
class StepUpdate:
    """What a step changed: `sampled` has one row per sampling entry in plan order; `finished` the sequences
    this update ended (each appears in exactly one update); `failed` the rows the caller must finish."""

    sampled: list[SampledToken] = field(default_factory=list)
    finished: list[Sequence] = field(default_factory=list)

    @property
    def failed(self) -> list[Sequence]:
        """Sequences whose row had no token (still unfinished: the caller ends them with its error)."""
        return [row.seq for row in self.sampled if row.token_id is None]


def update_from_output(
    plan: StepPlan,
    sampled: list[int | None],
    now: float,
    finish: Callable[[Sequence, str], None],
    eos_token_ids: Collection[int],
    text_stop: TextStop | None = None,
) -> StepUpdate:
    """Apply one step's output to the sequences of `plan.runnable_entries()`.

    `sampled`: one token (or None) per sampling entry among them, in plan order; `finish(seq, reason)` ends
    a sequence in the scheduler. Raises ValueError when `sampled` has the wrong length (nothing changes).
    """
    entries = plan.runnable_entries()
    sampling = [e for e in entries if e.is_sampling]  # before the tokens below become computed
    if len(sampled) != len(sampling):
        raise ValueError(f"{len(sampled)} sampled tokens for {len(sampling)} sampling entries")
    for entry in entries:
        if entry.seq.first_scheduled_time is None:
            entry.seq.first_scheduled_time = plan.start_time
        entry.seq.num_computed_tokens += entry.num_new_tokens
    update = StepUpdate()
    for entry, token in zip(sampling, sampled):
        seq = entry.seq
        update.sampled.append(SampledToken(seq, token))
        if token is None:
            continue
        seq.token_ids.append(token)
        if seq.first_token_time is None:
            seq.first_token_time = now
        reason = _stop_reason(seq, token, eos_token_ids, text_stop)
        if reason is not None:
            seq.finish_time = now
            finish(seq, reason)
            update.finished.append(seq)
    return update


def update_from_decode_steps(
    entries: list[BatchEntry], tokens: list[list[int]], now: float, finish: Callable[[Sequence, str], None]
) -> list[Sequence]:
    """Apply several steps of a multi-step window at once (scheduler/core/multi_step.py), where no token can
    stop a row (`are_finishes_known`): each row of `entries` (the window plan's `runnable_entries()`) gets its
    `tokens` (one list per row, one token per step, all rows as long) appended and computed; a row that
    reaches `max_tokens` ends with "length" at `now` (the last step's end: the window ends there). Returns the
    sequences it finished."""
    if len(tokens) != len(entries):
        raise ValueError(f"{len(tokens)} token rows for {len(entries)} entries")
    finished: list[Sequence] = []
    for entry, row in zip(entries, tokens):
        seq = entry.seq
        seq.num_computed_tokens += len(row)
        seq.token_ids.extend(row)
        if seq.num_output_tokens >= seq.max_tokens:
            seq.finish_time = now
            finish(seq, "length")
            finished.append(seq)
    return finished


def _stop_reason(
    seq: Sequence, token: int, eos_token_ids: Collection[int], text_stop: TextStop | None
) -> str | None:
    """Why seq stops after appending `token` ("stop" or "length"), or None while it goes on."""
    params = seq.sampling_params
    is_held = params.is_stop_held(seq.num_output_tokens)  # min_tokens: no stop ends it yet
    if not is_held and (token in params.stop_token_ids or (not params.ignore_eos and token in eos_token_ids)):
        return "stop"
    if text_stop is not None and text_stop(seq) and not is_held:
        return "stop"
    if seq.num_output_tokens >= seq.max_tokens:
        return "length"
    return None
