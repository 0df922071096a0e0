"""`EngineCounters.record_decode_steps` (a multi-step window's steps counted at once) leaves the counters one
count per step leaves: the same step total (added in step order, bit for bit), maximum and recent steps."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.engine_counters import RECENT_STEPS, EngineCounters

_seconds = st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(windows=st.lists(st.tuples(st.integers(1, 64), _seconds), min_size=1, max_size=6))
def test_a_windows_steps_counted_at_once_equal_one_count_per_step(
    windows: list[tuple[int, list[float]]],
) -> None:
    counters = EngineCounters()
    total, longest, num_steps, num_tokens, recent = 0.0, 0.0, 0, 0, []
    for num_rows, seconds in windows:
        counters.record_decode_steps(num_rows, seconds)
        for step_seconds in seconds:
            total += step_seconds
            longest = max(longest, step_seconds)
            num_steps += 1
            num_tokens += num_rows
            recent.append(step_seconds)
    assert counters.step_seconds == total and counters.max_step_seconds == longest
    assert (counters.num_steps, counters.num_batched_tokens, counters.num_output_tokens) == (
        num_steps,
        num_tokens,
        num_tokens,
    )
    assert list(counters.recent_decode_seconds) == recent[-RECENT_STEPS:]
