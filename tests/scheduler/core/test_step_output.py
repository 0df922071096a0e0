"""The update after a step (`BatchScheduler.update_from_output`, scheduler/core/step_output.py): computed and
appended tokens, stop token / EOS / length stops, the caller's text stop, failed rows and the time stamps."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.admission.batch_policy import FifoPolicy
from scheduler.core.adapter_residency import AdapterResidency
from scheduler.core.batch_scheduler import BatchScheduler
from scheduler.core.page_pool import PagePool
from scheduler.core.sampling import SamplingParams
from scheduler.core.sequence import Sequence, SequenceStatus
from tests.scheduler.core.scheduler_helpers import BLOCK_SIZE, PAGE_BYTES, ManualClock

EOS = 2


def make(clock: ManualClock | None = None, budget: int = 64, max_num_seqs: int = 8) -> BatchScheduler:
    pool = PagePool(64, BLOCK_SIZE)
    clock = clock or ManualClock()
    return BatchScheduler(
        pool,
        AdapterResidency(pool, PAGE_BYTES, clock=clock),
        FifoPolicy(),
        max_num_seqs,
        budget,
        clock=clock,
        eos_token_ids={EOS},
    )


def add(
    scheduler: BatchScheduler,
    request_id: str,
    num_prompt: int = 3,
    max_tokens: int = 4,
    ignore_eos: bool = False,
    stop_token_ids: tuple[int, ...] = (),
) -> Sequence:
    """Queue a greedy request of prompt tokens 10, 11, ..."""
    sampling = SamplingParams(max_tokens, 0.0, ignore_eos=ignore_eos, stop_token_ids=stop_token_ids)
    seq = Sequence(request_id, list(range(10, 10 + num_prompt)), sampling, None, max_tokens)
    scheduler.add(seq)
    return seq


def step(scheduler: BatchScheduler, tokens: dict[str, int | None], now: float = 0.0) -> list[Sequence]:
    """Schedule one step, sample `tokens[request_id]` for its sampling entries; the finished sequences."""
    plan = scheduler.schedule()
    sampled = [tokens[e.seq.request_id] for e in plan.runnable_entries() if e.is_sampling]
    return scheduler.update_from_output(plan, sampled, now).finished


def test_eos_stops_with_the_token_appended_and_the_sequence_returned() -> None:
    scheduler = make()
    seq = add(scheduler, "r")
    assert step(scheduler, {"r": EOS}) == [seq]
    assert seq.finish_reason == "stop" and seq.output_token_ids == [EOS] and seq.num_computed_tokens == 3
    assert seq.status is SequenceStatus.FINISHED and not scheduler.has_unfinished()
    assert scheduler.pool.num_free_blocks == scheduler.pool.num_blocks


def test_ignore_eos_goes_on_until_max_tokens() -> None:
    scheduler = make()
    seq = add(scheduler, "r", ignore_eos=True, max_tokens=2)
    assert step(scheduler, {"r": EOS}) == []
    assert step(scheduler, {"r": EOS}) == [seq]
    assert seq.finish_reason == "length" and seq.output_token_ids == [EOS, EOS]


def test_stop_token_ids_stop_even_with_ignore_eos() -> None:
    scheduler = make()
    seq = add(scheduler, "r", stop_token_ids=(5,), ignore_eos=True)
    assert step(scheduler, {"r": 4}) == []
    assert step(scheduler, {"r": 5}) == [seq]
    assert seq.finish_reason == "stop" and seq.output_token_ids == [4, 5]


def test_length_stop_at_max_tokens() -> None:
    scheduler = make()
    seq = add(scheduler, "r", max_tokens=3)
    finished = [step(scheduler, {"r": 9}) for _ in range(3)]
    assert finished == [[], [], [seq]] and seq.finish_reason == "length" and seq.num_output_tokens == 3


def test_a_stop_token_on_the_last_allowed_token_is_a_stop_not_a_length() -> None:
    scheduler = make()
    seq = add(scheduler, "r", max_tokens=1)
    step(scheduler, {"r": EOS})
    assert seq.finish_reason == "stop"


def test_text_stop_runs_after_the_token_stops_and_before_the_length_stop() -> None:
    scheduler = make()
    seq = add(scheduler, "r", max_tokens=2)
    seen: list[list[int]] = []

    def text_stop(s: Sequence) -> bool:
        seen.append(list(s.output_token_ids))
        return s.output_token_ids[-1] == 8

    for token, reason in ((7, None), (8, "stop")):
        plan = scheduler.schedule()
        scheduler.update_from_output(plan, [token], 0.0, text_stop=text_stop)
        assert seq.finish_reason == reason
    assert seen == [[7], [7, 8]]  # called with the token appended; a stop string beats the length stop

    other = add(scheduler, "eos")
    plan = scheduler.schedule()
    scheduler.update_from_output(plan, [EOS], 0.0, text_stop=text_stop)
    assert other.finish_reason == "stop" and len(seen) == 2  # a stop token ends it before any text


def test_a_failed_row_computes_its_tokens_but_appends_and_finishes_nothing() -> None:
    scheduler = make()
    bad, good = add(scheduler, "bad"), add(scheduler, "good", max_tokens=1)
    plan = scheduler.schedule()
    update = scheduler.update_from_output(plan, [None, 9], now=3.0)
    assert update.failed == [bad] and update.finished == [good]
    assert [(row.seq, row.token_id) for row in update.sampled] == [(bad, None), (good, 9)]
    assert bad.num_computed_tokens == 3 and bad.num_output_tokens == 0 and not bad.is_finished
    assert bad.first_token_time is None and bad.finish_time is None
    scheduler.finish(bad, "error")  # the caller ends it with its own error
    assert not scheduler.has_unfinished()


def test_a_chunked_prefill_computes_its_chunk_without_sampling() -> None:
    scheduler = make(budget=2)
    seq = add(scheduler, "r", num_prompt=5)
    plan = scheduler.schedule()
    update = scheduler.update_from_output(plan, [], 0.0)
    assert update.sampled == [] and seq.num_computed_tokens == 2 and seq.first_token_time is None


def test_times_come_from_the_plan_start_and_now() -> None:
    clock = ManualClock(10.0)
    scheduler = make(clock)
    seq = add(scheduler, "r", max_tokens=2)
    step(scheduler, {"r": 9}, now=10.5)
    clock.now = 11.0
    step(scheduler, {"r": 9}, now=11.5)
    assert (seq.first_scheduled_time, seq.first_token_time, seq.finish_time) == (10.0, 10.5, 11.5)


def test_a_sequence_finished_after_schedule_is_skipped_and_returned_once() -> None:
    scheduler = make()
    gone, kept = add(scheduler, "gone"), add(scheduler, "kept", max_tokens=1)
    plan = scheduler.schedule()
    scheduler.finish(gone, "abort")  # e.g. its adapter's copy failed before the step ran
    update = scheduler.update_from_output(plan, [9], 0.0)
    assert update.finished == [kept] and gone.num_computed_tokens == 0 and gone.output_token_ids == []
    assert scheduler.schedule().entries == []


def test_a_wrong_number_of_sampled_tokens_is_refused_and_changes_nothing() -> None:
    scheduler = make()
    seq = add(scheduler, "r")
    plan = scheduler.schedule()
    with pytest.raises(ValueError, match="1 sampling entries"):
        scheduler.update_from_output(plan, [9, 9], 0.0)
    assert seq.num_computed_tokens == 0 and seq.first_scheduled_time is None


requests = st.lists(
    st.tuples(
        st.integers(1, 9),  # prompt tokens
        st.integers(1, 5),  # max_tokens
        st.booleans(),  # ignore_eos
        st.sampled_from([(), (3,), (3, 4)]),  # stop_token_ids
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=150, deadline=None)
@given(reqs=requests, budget=st.integers(1, 16), tokens=st.data())
def test_every_request_ends_once_for_the_reason_its_tokens_give(
    reqs: list[tuple[int, int, bool, tuple[int, ...]]], budget: int, tokens: st.DataObject
) -> None:
    clock = ManualClock()
    scheduler = make(clock, budget=budget, max_num_seqs=3)
    seqs = [
        add(scheduler, f"r{i}", n, max_tokens=m, ignore_eos=ig, stop_token_ids=stop)
        for i, (n, m, ig, stop) in enumerate(reqs)
    ]
    finished: list[Sequence] = []
    while scheduler.has_unfinished():
        clock.now += 1.0
        plan = scheduler.schedule()
        num_sampling = sum(e.is_sampling for e in plan.runnable_entries())
        sampled = tokens.draw(
            st.lists(st.one_of(st.none(), st.integers(2, 6)), min_size=num_sampling, max_size=num_sampling)
        )
        update = scheduler.update_from_output(plan, sampled, now=clock.now + 0.5)
        for seq in update.failed:
            scheduler.finish(seq, "error")
        finished += update.finished
        assert all(s.is_finished for s in update.finished)
    assert len(finished) == len({id(s) for s in finished})  # returned once
    for seq in seqs:
        params, out = seq.sampling_params, seq.output_token_ids
        assert seq.is_finished and len(out) <= seq.max_tokens
        stops = set(params.stop_token_ids) | (set() if params.ignore_eos else {EOS})
        assert not stops & set(out[:-1])  # nothing goes on past a stop token
        if seq.finish_reason == "error":
            assert seq not in finished
            continue
        assert seq in finished
        assert seq.finish_reason == ("stop" if out[-1] in stops else "length")
        assert seq.finish_reason == "stop" or len(out) == seq.max_tokens
        assert seq.first_scheduled_time is not None and seq.first_token_time is not None
        assert seq.first_scheduled_time < seq.first_token_time <= seq.finish_time  # type: ignore[operator]
