"""The running batch's adapter-bytes bound through the real BatchScheduler: other tenants' adapters join a
running batch only while the distinct running adapters' bytes stay within it, so a burst of large cold
adapters cannot make every running stream's step read them all at once; a request of an adapter already
running always joins; everything still finishes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.admission.batch_policy import FifoPolicy
from scheduler.core.adapter_residency import AdapterResidency
from scheduler.core.batch_scheduler import BatchScheduler
from scheduler.core.page_pool import PagePool
from tests.scheduler.core.scheduler_helpers import BLOCK_SIZE, PAGE_BYTES, ManualClock, carry_out, make_seq


def bounded_scheduler(clock: ManualClock, max_running_adapter_bytes: int | None) -> BatchScheduler:
    pool = PagePool(400, BLOCK_SIZE)
    residency = AdapterResidency(pool, PAGE_BYTES, clock=clock)
    return BatchScheduler(
        pool,
        residency,
        FifoPolicy(),
        16,
        256,
        clock=clock,
        max_running_adapter_bytes=max_running_adapter_bytes,
    )


def running_adapter_bytes(scheduler: BatchScheduler) -> tuple[int, int]:
    """(distinct adapters running, their bytes)."""
    adapters = {s.adapter_id for s in scheduler.running if s.adapter_id is not None}
    return len(adapters), sum(scheduler.residency.get(a).num_bytes for a in adapters)  # type: ignore[union-attr]


def burst(max_running_adapter_bytes: int | None) -> tuple[list[int], list[int]]:
    """A base-model stream runs; then one request each of four 100-byte adapters arrives at once.
    -> (distinct adapters running after each step, base stream tokens gained per step)."""
    clock = ManualClock()
    scheduler = bounded_scheduler(clock, max_running_adapter_bytes)
    for name in "abcd":
        scheduler.residency.register(name, f"/adapters/{name}", rank=8, num_bytes=100)
    scheduler.add(make_seq("stream", 4, 40, None, 0.0))
    carry_out(scheduler, scheduler.schedule())
    for i, name in enumerate("abcd"):
        scheduler.add(make_seq(f"cold-{name}", 4, 3, name, 1.0 + i * 0.01))
    num_adapters, stream_gains = [], []
    stream = scheduler.get("stream")
    assert stream is not None
    while any(
        r.startswith("cold") for r in list(scheduler.waiting) + [s.request_id for s in scheduler.running]
    ):
        before = stream.num_tokens
        carry_out(scheduler, scheduler.schedule())
        clock.now += 1.0
        num_adapters.append(running_adapter_bytes(scheduler)[0])
        stream_gains.append(stream.num_tokens - before)
    return num_adapters, stream_gains


def test_bound_lets_at_most_its_worth_of_new_adapters_join_and_the_running_stream_never_waits() -> None:
    num_adapters, stream_gains = burst(max_running_adapter_bytes=250)
    assert max(num_adapters) == 2  # 2 x 100 bytes fit in 250, a third does not
    assert set(stream_gains) == {1}  # the base stream decodes every step


def test_without_the_bound_the_whole_burst_joins_at_once() -> None:
    num_adapters, _ = burst(max_running_adapter_bytes=None)
    assert max(num_adapters) == 4


def test_a_request_of_an_adapter_already_running_joins_a_full_batch() -> None:
    clock = ManualClock()
    scheduler = bounded_scheduler(clock, max_running_adapter_bytes=150)
    for name in "ab":
        scheduler.residency.register(name, f"/adapters/{name}", rank=8, num_bytes=100)
    scheduler.add(make_seq("a-1", 4, 20, "a", 0.0))
    carry_out(scheduler, scheduler.schedule())
    scheduler.add(make_seq("b-1", 4, 20, "b", 1.0))  # FIFO head: b would cross the bound, it waits
    scheduler.add(make_seq("base", 4, 20, None, 1.1))  # behind it (FIFO keeps the order)
    carry_out(scheduler, scheduler.schedule())
    assert {s.request_id for s in scheduler.running} == {"a-1"}
    scheduler = bounded_scheduler(ManualClock(), max_running_adapter_bytes=150)
    scheduler.residency.register("a", "/adapters/a", rank=8, num_bytes=100)
    scheduler.add(make_seq("a-1", 4, 20, "a", 0.0))
    carry_out(scheduler, scheduler.schedule())
    scheduler.add(make_seq("a-2", 4, 20, "a", 1.0))
    carry_out(scheduler, scheduler.schedule())
    assert {s.request_id for s in scheduler.running} == {"a-1", "a-2"}


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 300), min_size=4, max_size=4),
    requests=st.lists(
        st.tuples(
            st.integers(1, 8), st.integers(1, 5), st.one_of(st.none(), st.integers(0, 3)), st.integers(0, 6)
        ),
        min_size=1,
        max_size=16,
    ),
    bound=st.integers(1, 600),
)
def test_running_adapters_stay_within_the_bound_or_are_one_and_every_request_finishes(
    sizes: list[int], requests: list[tuple[int, int, int | None, int]], bound: int
) -> None:
    clock = ManualClock()
    scheduler = bounded_scheduler(clock, max_running_adapter_bytes=bound)
    for i, size in enumerate(sizes):
        scheduler.residency.register(f"a{i}", f"/adapters/a{i}", rank=4, num_bytes=size)
    for step in range(300):
        for i, (num_prompt, max_tokens, adapter, arrival) in enumerate(requests):
            if arrival == step:
                name = None if adapter is None else f"a{adapter}"
                scheduler.add(make_seq(f"r{i}", num_prompt, max_tokens, name, float(step)))
        if step > max(r[3] for r in requests) and not scheduler.has_unfinished():
            break
        carry_out(scheduler, scheduler.schedule())
        clock.now += 1.0
        num_adapters, num_bytes = running_adapter_bytes(scheduler)
        assert num_adapters <= 1 or num_bytes <= bound
    assert not scheduler.has_unfinished()
