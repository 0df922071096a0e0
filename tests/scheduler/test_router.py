from scheduler.router import ResidencyThenLeastLoaded, RouteRequest, WorkerView

BASE = "base"


def _w(worker_id: str, running: int = 0, device=(), host=(), ready=True, base=BASE) -> WorkerView:
    return WorkerView(worker_id, base, num_running=running, max_num_seqs=8,
                      device_adapters=frozenset(device), host_adapters=frozenset(host), is_ready=ready)


def test_prefers_worker_with_adapter_on_device_over_idle_worker() -> None:
    workers = [_w("a", running=0), _w("b", running=5, device={"x"})]
    assert ResidencyThenLeastLoaded().choose(RouteRequest(BASE, "x"), workers) == "b"


def test_prefers_host_resident_over_cold() -> None:
    workers = [_w("a"), _w("b", running=3, host={"x"})]
    assert ResidencyThenLeastLoaded().choose(RouteRequest(BASE, "x"), workers) == "b"


def test_cold_adapter_goes_to_least_loaded() -> None:
    workers = [_w("a", running=4), _w("b", running=1), _w("c", running=2)]
    assert ResidencyThenLeastLoaded().choose(RouteRequest(BASE, "x"), workers) == "b"


def test_ties_break_by_worker_id() -> None:
    workers = [_w("b"), _w("a")]
    assert ResidencyThenLeastLoaded().choose(RouteRequest(BASE, None), workers) == "a"


def test_no_ready_worker_for_base_model_returns_none() -> None:
    workers = [_w("a", ready=False), _w("b", base="other")]
    assert ResidencyThenLeastLoaded().choose(RouteRequest(BASE, "x"), workers) is None


def test_router_policies_are_chosen_by_name() -> None:
    from scheduler.router import DEFAULT_ROUTER_POLICY, ROUTER_POLICIES, make_router

    assert isinstance(make_router(), ROUTER_POLICIES[DEFAULT_ROUTER_POLICY])
    assert isinstance(make_router("residency_least_loaded"), ResidencyThenLeastLoaded)


def test_an_unknown_router_policy_names_the_choices() -> None:
    import pytest

    from scheduler.router import make_router

    with pytest.raises(ValueError, match="residency_least_loaded"):
        make_router("round_robin")


def test_residency_router_keeps_to_the_assigned_workers_while_one_is_live() -> None:
    workers = [_w("a", device={"x"}), _w("b", running=6), _w("c", running=2)]
    request = RouteRequest(BASE, "x", assigned_workers=(("b", 0.5), ("c", 0.5)))
    assert ResidencyThenLeastLoaded().choose(request, workers) == "c"  # "a" holds x but is not assigned
    gone = RouteRequest(BASE, "x", assigned_workers=(("z", 1.0),))
    assert ResidencyThenLeastLoaded().choose(gone, workers) == "a"  # no assigned worker live: every ready one


def test_placement_weighted_draws_by_weight_among_assigned_workers_only() -> None:
    from collections import Counter

    from scheduler.router import PlacementWeightedRandom, make_router

    workers = [_w("a"), _w("b", running=7), _w("c")]
    request = RouteRequest(BASE, "x", assigned_workers=(("a", 0.8), ("b", 0.2)))
    router = PlacementWeightedRandom(seed=1)
    counts = Counter(router.choose(request, workers) for _ in range(2000))
    assert set(counts) == {"a", "b"}  # blind to b's load, never c
    assert 0.75 < counts["a"] / 2000 < 0.85
    assert isinstance(make_router("placement_weighted"), PlacementWeightedRandom)
    assert router.choose(RouteRequest(BASE, "x"), [_w("a", ready=False)]) is None
