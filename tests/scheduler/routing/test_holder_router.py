"""holders_least_loaded and the yield-to-load bound: holders first within the bound, rank fit, spread."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.routing.holder_router import HoldersLeastLoaded
from scheduler.routing.router import (
    DEFAULT_MAX_LOAD_GAP,
    ResidencyThenLeastLoaded,
    RouteRequest,
    RouterOptions,
    WorkerView,
    rank_mismatch,
)
from scheduler.routing.router_policies import make_router
from settings import Settings

BASE = "base"
SLOTS = 16


def _w(worker_id: str, running: int = 0, device=(), ranks=()) -> WorkerView:
    return WorkerView(
        worker_id,
        BASE,
        num_running=running,
        max_num_seqs=SLOTS,
        device_adapters=frozenset(device),
        running_ranks=tuple(ranks),
    )


def _request(holders: tuple[str, ...], rank: int = 8) -> RouteRequest:
    row = tuple((w, 1 / len(holders)) for w in holders)
    return RouteRequest(BASE, "x", adapter_rank=rank, assigned_workers=row)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=6),
    st.sets(st.integers(0, 5), min_size=1),
    st.sampled_from([0.0, 0.0625, 0.125, 0.5]),
    st.lists(st.sampled_from([8, 16, 64, 128]), min_size=6, max_size=6),
)
def test_a_non_holder_is_chosen_only_when_every_holder_is_past_the_bound(
    running: list[int], holder_ids: set[int], gap: float, ranks: list[int]
) -> None:
    workers = [_w(f"w{i}", n, ranks=[ranks[i]] * min(n, 1)) for i, n in enumerate(running)]
    holders = tuple(f"w{i}" for i in sorted(holder_ids) if i < len(workers))
    request = _request(holders or ("gone",), rank=16)
    chosen = HoldersLeastLoaded(gap).choose(request, workers)
    load = {w.worker_id: w.load for w in workers}
    least = min(load.values())
    if any(load[h] <= least + gap for h in holders):
        assert chosen in holders
    assert load[chosen] <= least + gap + 1e-12  # never busier than the least-loaded worker + the bound


def test_requests_of_a_hot_adapter_with_one_holder_spread_within_the_bound() -> None:
    """A deterministic stream: every request is for the hot adapter held (and resident) on w0 only; each
    routed request adds one to its worker's queue. No worker ends more than the bound + one request above
    the least-loaded one; residency-first routing without a bound puts everything on w0."""
    gap = 0.25
    for router, spread_ok in ((HoldersLeastLoaded(gap), True), (ResidencyThenLeastLoaded(), False)):
        workers = {w: _w(w, device={"x"} if w == "w0" else ()) for w in ("w0", "w1", "w2", "w3")}
        for _ in range(200):
            chosen = router.choose(_request(("w0",)), list(workers.values()))
            assert chosen is not None
            workers[chosen] = replace(workers[chosen], num_waiting=workers[chosen].num_waiting + 1)
        loads = [w.load for w in workers.values()]
        assert (max(loads) - min(loads) <= gap + 1 / SLOTS) is spread_ok


def test_residency_first_yields_to_load_past_the_bound_and_never_without_one() -> None:
    workers = [_w("a", running=12, device={"x"}), _w("b", running=2)]
    request = RouteRequest(BASE, "x")
    assert ResidencyThenLeastLoaded().choose(request, workers) == "a"  # today's behaviour (no bound)
    assert ResidencyThenLeastLoaded(max_load_gap=0.75).choose(request, workers) == "a"  # 10/16 busier
    assert ResidencyThenLeastLoaded(max_load_gap=0.5).choose(request, workers) == "b"


def test_within_the_bound_the_worker_whose_batches_match_the_rank_wins() -> None:
    workers = [_w("a", running=1, ranks=[128]), _w("b", running=2, ranks=[8, 8])]
    router = HoldersLeastLoaded(0.125)
    assert router.choose(_request(("a", "b"), rank=8), workers) == "b"  # a would pad rank 8 to 128
    assert router.choose(_request(("a", "b"), rank=128), workers) == "a"  # b would pad every request
    assert HoldersLeastLoaded(0.0).choose(_request(("a", "b"), rank=8), workers) == "a"  # no band: load


def test_rank_mismatch_orders_raising_above_padding_above_matching() -> None:
    worker = _w("a", running=2, ranks=[32, 16])
    assert rank_mismatch(worker, 32) == (0, 0)
    assert rank_mismatch(worker, 8) == (1, 24)
    assert rank_mismatch(worker, 128) == (2, 96)
    assert rank_mismatch(_w("idle"), 128) == (0, 0)


def test_without_a_live_holder_every_ready_worker_is_eligible() -> None:
    workers = [_w("a", running=4), _w("b", running=1)]
    assert HoldersLeastLoaded().choose(_request(("gone",)), workers) == "b"
    assert HoldersLeastLoaded().choose(RouteRequest(BASE, "x"), []) is None


def test_the_bound_comes_from_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert make_router("holders_least_loaded").max_load_gap == DEFAULT_MAX_LOAD_GAP  # type: ignore[attr-defined]
    router = make_router("holders_least_loaded", RouterOptions(max_load_gap=0.3))
    assert router.max_load_gap == 0.3  # type: ignore[attr-defined]
    assert make_router("residency_least_loaded").max_load_gap is None  # type: ignore[attr-defined]
    monkeypatch.setenv("LORAHOST_ROUTER_MAX_LOAD_GAP", "0.2")
    assert Settings().routing.max_load_gap == 0.2
    with pytest.raises(ValueError, match="max_load_gap"):
        HoldersLeastLoaded(-1.0)
