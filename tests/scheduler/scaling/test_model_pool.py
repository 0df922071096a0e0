"""The embedded model pool's policy (scheduler/scaling/model_pool.py): start what requests wait for, stop what has been
idle, stay within the memory budget, never stop the pinned model or a busy one (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.scaling.model_pool import BlockedModel, PooledModel, plan_model_pool

GB = 1 << 30


def test_a_waited_for_model_starts_and_an_idle_one_stops_after_the_timeout() -> None:
    models = [
        PooledModel("base", GB, is_running=True, idle_since_s=0.0, is_pinned=True),
        PooledModel("wide", GB, is_running=False, num_waiting=2),
        PooledModel("old", GB, is_running=True, idle_since_s=10.0),
    ]
    plan = plan_model_pool(models, budget_bytes=None, idle_timeout_s=60.0, now_s=50.0)
    assert (plan.to_start, plan.to_stop) == (("wide",), ())
    later = plan_model_pool(models, budget_bytes=None, idle_timeout_s=60.0, now_s=71.0)
    assert later.to_stop == ("old",)  # the pinned model idles for ever


def test_room_is_made_by_stopping_the_longest_idle_model_and_a_model_without_room_waits() -> None:
    models = [
        PooledModel("base", GB, is_running=True, idle_since_s=0.0, is_pinned=True),
        PooledModel("a", GB, is_running=True, idle_since_s=30.0),
        PooledModel("b", GB, is_running=True, idle_since_s=20.0),
        PooledModel("busy", GB, is_running=True, num_active=1),
        PooledModel("wide", GB, is_running=False, num_waiting=1),
    ]
    plan = plan_model_pool(models, budget_bytes=4 * GB, idle_timeout_s=600.0, now_s=40.0)
    assert (plan.to_start, plan.to_stop) == (("wide",), ("b",))
    huge = [*models[:4], PooledModel("huge", 3 * GB, is_running=False, num_waiting=1)]
    waits = plan_model_pool(huge, budget_bytes=4 * GB, idle_timeout_s=600.0, now_s=40.0)
    assert (waits.to_start, waits.to_stop) == ((), ())  # stopping a and b would not make room: nothing stops


def test_a_second_model_starts_with_what_the_budget_has_left_down_to_its_smallest_size() -> None:
    base = PooledModel("base", 3 * GB, is_running=True, is_pinned=True)
    wide = PooledModel("wide", 4 * GB, is_running=False, num_waiting=1, min_bytes=GB)
    plan = plan_model_pool([base, wide], budget_bytes=6 * GB, idle_timeout_s=600.0, now_s=0.0)
    assert plan.to_start == ("wide",) and plan.granted("wide") == 3 * GB  # 4 GiB asked, 3 left
    roomy = plan_model_pool([base, wide], budget_bytes=8 * GB, idle_timeout_s=600.0, now_s=0.0)
    assert roomy.granted("wide") == 4 * GB  # its configured pools when they fit
    tight = plan_model_pool([base, wide], budget_bytes=3 * GB + GB // 2, idle_timeout_s=600.0, now_s=0.0)
    assert tight.to_start == () and tight.blocked == (
        BlockedModel("wide", GB, GB // 2, 3 * GB + GB // 2, is_final=True),
    )  # below its smallest size beside the pinned model: it can never start


def test_idle_models_are_stopped_least_recently_used_first_for_a_full_size_and_busy_ones_block() -> None:
    base = PooledModel("base", GB, is_running=True, is_pinned=True)
    old = PooledModel("old", GB, is_running=True, idle_since_s=5.0)
    recent = PooledModel("recent", GB, is_running=True, idle_since_s=30.0)
    wide = PooledModel("wide", 2 * GB, is_running=False, num_waiting=1, min_bytes=GB // 2)
    plan = plan_model_pool([base, old, recent, wide], budget_bytes=4 * GB, idle_timeout_s=600.0, now_s=40.0)
    assert (plan.to_stop, plan.granted("wide")) == (("old",), 2 * GB)  # the least recently used stops
    busy = PooledModel("busy", 3 * GB, is_running=True, num_active=3)
    waits = plan_model_pool([base, busy, wide], budget_bytes=4 * GB, idle_timeout_s=600.0, now_s=40.0)
    assert waits.to_start == () and waits.to_stop == ()
    assert waits.blocked[0].name == "wide" and not waits.blocked[0].is_final  # it starts once busy is idle


models_strategy = st.lists(
    st.builds(
        PooledModel,
        name=st.sampled_from([f"m{i}" for i in range(8)]),
        num_bytes=st.integers(1, 4),
        is_running=st.booleans(),
        num_waiting=st.integers(0, 3),
        num_active=st.integers(0, 2),
        idle_since_s=st.one_of(st.none(), st.floats(0, 100)),
        is_pinned=st.booleans(),
        min_bytes=st.one_of(st.none(), st.integers(1, 4)),
    ),
    max_size=8,
    unique_by=lambda m: m.name,
)


@settings(max_examples=300, deadline=None)
@given(models=models_strategy, budget=st.one_of(st.none(), st.integers(0, 12)), now=st.floats(0, 200))
def test_plans_keep_the_budget_and_never_stop_pinned_or_busy_models(
    models: list[PooledModel], budget: int | None, now: float
) -> None:
    plan = plan_model_pool(models, budget_bytes=budget, idle_timeout_s=50.0, now_s=now)
    by_name = {m.name: m for m in models}
    assert all(
        by_name[n].is_running and by_name[n].is_idle and not by_name[n].is_pinned for n in plan.to_stop
    )
    assert all(not by_name[n].is_running and by_name[n].num_waiting > 0 for n in plan.to_start)
    before = sum(m.num_bytes for m in models if m.is_running)
    after = (
        before
        - sum(by_name[n].num_bytes for n in plan.to_stop)
        + sum(plan.granted(n) or 0 for n in plan.to_start)
    )
    assert all(
        by_name[n].smallest_bytes <= (plan.granted(n) or 0) <= by_name[n].num_bytes for n in plan.to_start
    )
    if plan.to_start and budget is not None:
        assert after <= budget  # a start never takes the pool past its budget
    assert not {b.name for b in plan.blocked} & set(plan.to_start)
    if budget is None:
        assert {m.name for m in models if not m.is_running and m.num_waiting} == set(plan.to_start)
