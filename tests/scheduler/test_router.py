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
