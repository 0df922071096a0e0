"""Adapter residency with an eviction policy: idle adapters by the policy, waiting-only ones after them,
running ones never; access statistics on an injected clock; a hypothesis run of random operations for every
policy keeps the page budget, the page partition and the running pins."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cache.eviction import EVICTION_POLICIES, make_eviction_policy
from scheduler.core.adapter_residency import RESERVED_RESIDENCIES, AdapterResidency, Residency
from scheduler.core.page_pool import PagePool
from tests.scheduler.core.scheduler_helpers import PAGE_BYTES, ManualClock


def make_residency(
    policy: str, num_kv_pages: int = 8, num_adapter_pages: int = 8
) -> tuple[AdapterResidency, ManualClock]:
    clock = ManualClock()
    pool = PagePool(num_kv_pages + num_adapter_pages, 4, num_kv_pages)
    residency = AdapterResidency(pool, PAGE_BYTES, policy=make_eviction_policy(policy), clock=clock)
    return residency, clock


def load(residency: AdapterResidency, name: str, num_bytes: int, load_seconds: float | None = None) -> None:
    residency.register(name, f"/host/{name}", rank=num_bytes // PAGE_BYTES, num_bytes=num_bytes)
    assert residency.plan_load(name, may_evict_waiting=False) is not None
    residency.mark_loaded(name, load_seconds)


def fill_cache(policy: str) -> tuple[AdapterResidency, ManualClock]:
    """An 8-page adapter share holding a big popular adapter (LRU) and a small rare one (used last)."""
    residency, clock = make_residency(policy, num_kv_pages=4, num_adapter_pages=8)
    load(residency, "big_hot", 600)
    for _ in range(5):
        residency.record_access("big_hot")
    clock.now = 10.0
    load(residency, "small_rare", 200)
    residency.record_access("small_rare")
    clock.now = 12.0
    residency.register("new", "/host/new", rank=2, num_bytes=200)  # needs 2 pages; 0 adapter-only + 4 KV free
    return residency, clock


@pytest.mark.parametrize(("policy", "victim"), [("lru", "big_hot"), ("chameleon", "small_rare")])
def test_the_policy_picks_which_idle_adapter_makes_room(policy: str, victim: str) -> None:
    residency, _ = fill_cache(policy)
    assert residency.plan_load("new", may_evict_waiting=False, min_free_kv_blocks=3) == [victim]
    assert residency.residency(victim) is Residency.HOST and residency.residency("new") is Residency.PREPARING


def test_fastlibra_evicts_the_adapter_that_reloads_fastest_per_expected_use() -> None:
    residency, _ = make_residency("fastlibra", num_kv_pages=4, num_adapter_pages=8)
    load(residency, "slow", 400, load_seconds=2.0)
    load(residency, "fast", 400, load_seconds=0.01)
    for name in ("slow", "fast", "fast"):
        residency.record_access(name)
    residency.register("new", "/host/new", rank=4, num_bytes=400)
    assert residency.plan_load("new", may_evict_waiting=False, min_free_kv_blocks=4) == ["fast"]


def test_waiting_only_adapters_go_after_every_idle_one_whatever_the_policy_scores() -> None:
    residency, _ = fill_cache("chameleon")
    residency.pin("small_rare")  # a waiting request uses the adapter chameleon would evict first
    assert residency.eviction_order(may_evict_waiting=False) == ["big_hot"]
    assert residency.eviction_order(may_evict_waiting=True) == ["big_hot", "small_rare"]


@pytest.mark.parametrize("policy", sorted(EVICTION_POLICIES))
def test_running_adapters_are_never_candidates(policy: str) -> None:
    residency, _ = fill_cache(policy)
    residency.pin("big_hot", is_running=True)
    residency.pin("small_rare", is_running=True)
    assert residency.eviction_order(may_evict_waiting=True) == []
    assert residency.plan_load("new", may_evict_waiting=True, min_free_kv_blocks=3) is None
    assert residency.residency("new") is Residency.HOST


def test_min_free_kv_blocks_refuses_a_load_into_the_last_kv_pages_of_a_unified_pool() -> None:
    residency, _ = make_residency("lru", num_kv_pages=6, num_adapter_pages=0)  # unified: 6 pages in all
    residency.register("a", "/host/a", rank=3, num_bytes=300)  # 3 pages
    assert residency.plan_load("a", may_evict_waiting=False, min_free_kv_blocks=4) is None
    assert residency.plan_load("a", may_evict_waiting=False, min_free_kv_blocks=3) == []
    assert residency.pool.num_free_blocks == 3


def test_a_static_adapter_share_never_takes_kv_pages() -> None:
    residency, _ = make_residency("lru", num_kv_pages=4, num_adapter_pages=2)
    residency.register("a", "/host/a", rank=3, num_bytes=300)  # 3 pages > the 2-page adapter share
    assert residency.plan_load("a", may_evict_waiting=False) is None
    assert residency.pool.num_free_blocks == 4


def test_without_the_adapter_cache_idle_adapters_leave_the_device_and_used_ones_stay() -> None:
    pool = PagePool(18, 4, 8)  # 10 adapter pages: five adapters of 2 pages
    residency = AdapterResidency(pool, PAGE_BYTES, is_caching_idle_adapters=False)
    for name in ("idle", "running", "queued"):
        load(residency, name, 200)
    residency.pin("running", is_running=True)
    residency.pin("queued")
    for name in ("preparing", "copying"):
        residency.register(name, f"/host/{name}", rank=2, num_bytes=200)
        assert residency.plan_load(name, may_evict_waiting=False) == []  # its load has not landed
    residency.mark_prepared("copying")
    num_free = pool.num_free_pages
    assert residency.drop_idle_adapters() == ["idle"]
    assert residency.residency("idle") is Residency.HOST and pool.num_free_pages == num_free + 2
    assert [residency.residency(a) for a in ("running", "queued", "preparing", "copying")] == [
        Residency.DEVICE,
        Residency.DEVICE,
        Residency.PREPARING,
        Residency.COPYING,
    ]
    residency.unpin("running", is_running=True)
    residency.mark_loaded("copying")
    assert sorted(residency.drop_idle_adapters()) == ["copying", "running"]
    assert residency.device_adapters() == ["queued", "preparing"] and residency.num_evictions == 3


def test_with_the_adapter_cache_idle_adapters_stay_on_the_device() -> None:
    residency, _ = make_residency("lru")
    load(residency, "idle", 200)
    assert residency.is_caching_idle_adapters and residency.drop_idle_adapters() == []
    assert residency.residency("idle") is Residency.DEVICE and residency.num_evictions == 0


def test_accesses_leave_the_window_and_the_measured_load_time_replaces_the_estimate() -> None:
    residency, clock = make_residency("fastlibra")
    load(residency, "a", 200)
    state = residency.get("a")
    assert state is not None and residency.load_seconds_of(state) == pytest.approx(200 / 16e9)
    residency.record_access("a")
    residency.record_access("a")
    assert residency.num_recent_accesses("a") == 2 and residency.cache_view().access_shares == (1.0,)
    clock.now = residency.access_window_s + 1.0
    assert residency.num_recent_accesses("a") == 0 and residency.cache_view().num_recent_accesses == 0
    residency.evict("a")
    assert residency.plan_load("a", may_evict_waiting=False) == []
    residency.mark_loaded("a", load_seconds=0.25)
    assert residency.load_seconds_of(state) == 0.25
    assert (residency.num_timed_loads, residency.load_seconds_total) == (1, 0.25)


def test_recent_batch_size_is_the_mean_over_the_last_seconds() -> None:
    residency, clock = make_residency("fastlibra")
    residency.record_batch_size(8)
    clock.now = 10.0
    residency.record_batch_size(2)
    residency.record_batch_size(4)
    assert residency.cache_view().recent_batch_size == 3.0


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 8), st.lists(st.floats(0.0, 3.0), min_size=1, max_size=6)),
        min_size=1,
        max_size=8,
    )
)
def test_a_windows_batch_sizes_at_once_equal_one_record_per_step(
    windows: list[tuple[int, list[float]]],
) -> None:
    at_once, _ = make_residency("fastlibra")
    per_step, _ = make_residency("fastlibra")
    now = 0.0
    for num_seqs, gaps in windows:
        starts = [now := now + gap for gap in gaps]
        at_once.record_batch_sizes(num_seqs, starts)
        for start in starts:
            per_step.record_batch_size(num_seqs, now=start)
        assert list(at_once.access._batch_sizes) == list(per_step.access._batch_sizes)
        assert at_once.cache_view().recent_batch_size == per_step.cache_view().recent_batch_size


# ---- random operations -------------------------------------------------------------------------------

ADAPTERS = [f"a{i}" for i in range(5)]
operations = st.lists(
    st.one_of(
        st.tuples(st.just("plan_load"), st.sampled_from(ADAPTERS), st.booleans(), st.integers(0, 3)),
        st.tuples(st.just("mark_prepared"), st.sampled_from(ADAPTERS)),
        st.tuples(st.just("mark_loaded"), st.sampled_from(ADAPTERS), st.floats(0.0, 1.0)),
        st.tuples(st.just("pin"), st.sampled_from(ADAPTERS), st.booleans()),
        st.tuples(st.just("unpin"), st.sampled_from(ADAPTERS), st.booleans()),
        st.tuples(st.just("access"), st.sampled_from(ADAPTERS)),
        st.tuples(st.just("evict_idle"), st.integers(0, 4)),
        st.tuples(st.just("kv_allocate"), st.integers(1, 4)),
        st.tuples(st.just("kv_free"), st.integers(0, 8)),
        st.tuples(st.just("evict_for_kv"), st.integers(1, 6)),
        st.tuples(st.just("tick"), st.floats(0.0, 40.0)),
    ),
    max_size=60,
)


def check_invariants(residency: AdapterResidency, num_pages: int) -> None:
    pool = residency.pool
    assert pool.num_used_pages <= num_pages
    assert pool.num_used_pages + pool.num_free_pages == num_pages
    adapter_pages = [p for a in residency.device_adapters() for p in residency.get(a).page_ids]  # type: ignore[union-attr]
    assert len(adapter_pages) == len(set(adapter_pages)) == pool.num_adapter_pages
    assert all(residency.residency(a) in RESERVED_RESIDENCIES for a in residency.device_adapters())


@settings(max_examples=150, deadline=None)
@given(
    policy=st.sampled_from(sorted(EVICTION_POLICIES)),
    sizes=st.lists(st.integers(1, 500), min_size=len(ADAPTERS), max_size=len(ADAPTERS)),
    num_kv_pages=st.integers(2, 10),
    num_adapter_pages=st.integers(0, 8),
    ops=operations,
)
def test_random_operations_keep_the_budget_the_partition_and_running_pins(
    policy: str, sizes: list[int], num_kv_pages: int, num_adapter_pages: int, ops: list[tuple]
) -> None:
    residency, clock = make_residency(policy, num_kv_pages, num_adapter_pages)
    num_pages = num_kv_pages + num_adapter_pages
    for name, size in zip(ADAPTERS, sizes):
        residency.register(name, f"/host/{name}", rank=max(size // 50, 1), num_bytes=size)
    kv_blocks: list[int] = []
    for op in ops:
        running_on_device = {
            a
            for a in residency.device_adapters()
            if residency.get(a).num_running > 0  # type: ignore[union-attr]
        }
        kind, *args = op
        if kind == "plan_load":
            adapter_id, may_evict_waiting, min_free = args
            was_on_host = residency.residency(adapter_id) is Residency.HOST
            victims = residency.plan_load(adapter_id, may_evict_waiting, min_free)
            if victims:
                assert not set(victims) & running_on_device
                if not may_evict_waiting:
                    assert all(not residency.get(v).num_waiting for v in victims)  # type: ignore[union-attr]
            if victims is not None and was_on_host:
                assert residency.pool.num_free_blocks >= min_free
        elif kind == "mark_prepared" and residency.residency(args[0]) is Residency.PREPARING:
            residency.mark_prepared(args[0])
        elif kind == "mark_loaded" and residency.residency(args[0]) is Residency.COPYING:
            residency.mark_loaded(args[0], args[1])
        elif kind == "pin":
            residency.pin(args[0], is_running=args[1])
        elif kind == "unpin":
            residency.unpin(args[0], is_running=args[1])
        elif kind == "access":
            residency.record_access(args[0])
        elif kind == "evict_idle":
            order = residency.eviction_order(may_evict_waiting=False)
            if order:
                residency.evict(order[args[0] % len(order)])
        elif kind == "kv_allocate":
            kv_blocks += residency.pool.allocate(args[0]) or []
        elif kind == "kv_free" and kv_blocks:
            freed, kv_blocks = kv_blocks[: args[0]], kv_blocks[args[0] :]
            residency.pool.free(freed)
        elif kind == "evict_for_kv":
            evicted = residency.evict_for_kv(args[0])
            assert not set(evicted) & running_on_device
        elif kind == "tick":
            clock.now += args[0]
        assert running_on_device <= set(residency.device_adapters())  # a running-pinned adapter stays
        check_invariants(residency, num_pages)
        assert residency.pool.num_kv_pages == len(kv_blocks)
