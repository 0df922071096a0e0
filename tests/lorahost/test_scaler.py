"""The local process scaler: scaling answers -> process actions (pure plan, a fake pool, a fake endpoint)."""

from __future__ import annotations

import json

import httpx
from hypothesis import given
from hypothesis import strategies as st

from lorahost.scaler import (
    ModelWorkers,
    ProcessScaler,
    ScalePlan,
    ScalingTarget,
    fetch_scaling,
    parse_target,
    plan_scaling,
)


class FakePool:
    """Managed workers as ids; records what the scaler asked for."""

    def __init__(self, ids: list[str]) -> None:
        self.ids = list(ids)
        self.started: list[str] = []
        self.stopped: list[str] = []
        self._next = len(ids)

    def worker_ids(self) -> list[str]:
        return list(self.ids)

    def start_worker(self, *, wait: bool = True) -> str:
        assert wait is False  # the scaler never blocks on a model load
        worker_id = f"w{self._next}"
        self._next += 1
        self.ids.append(worker_id)
        self.started.append(worker_id)
        return worker_id

    def stop_worker(self, worker: int | str, *, wait: bool = True) -> str:
        assert wait is False and isinstance(worker, str)
        self.ids.remove(worker)
        self.stopped.append(worker)
        return worker


def target(desired: int) -> ScalingTarget:
    return ScalingTarget(base_model="lorahost-base", desired_workers=desired, reason="test")


def test_plan_starts_the_missing_workers() -> None:
    assert plan_scaling(3, ["w0"], max_workers=8) == ScalePlan(num_to_start=2)


def test_plan_stops_the_newest_workers_first_down_to_zero() -> None:
    assert plan_scaling(1, ["w0", "w1", "w2"], max_workers=8) == ScalePlan(stop_ids=("w2", "w1"))
    assert plan_scaling(0, ["w0", "w1"], max_workers=8) == ScalePlan(stop_ids=("w1", "w0"))


def test_plan_clamps_to_max_workers_and_zero() -> None:
    assert plan_scaling(50, [], max_workers=4) == ScalePlan(num_to_start=4)
    assert plan_scaling(-3, ["w0"], max_workers=4) == ScalePlan(stop_ids=("w0",))
    assert plan_scaling(2, ["w0", "w1"], max_workers=4).is_noop


@given(
    desired=st.integers(-5, 40),
    num_managed=st.integers(0, 20),
    max_workers=st.integers(0, 16),
)
def test_plan_reaches_the_clamped_target_and_keeps_the_oldest(
    desired: int, num_managed: int, max_workers: int
) -> None:
    ids = [f"w{i}" for i in range(num_managed)]
    plan = plan_scaling(desired, ids, max_workers)
    expected = max(0, min(desired, max_workers))
    assert plan.num_to_start == 0 or not plan.stop_ids  # never both
    assert len(ids) + plan.num_to_start - len(plan.stop_ids) == expected
    assert set(plan.stop_ids) <= set(ids) and len(set(plan.stop_ids)) == len(plan.stop_ids)
    kept = [i for i in ids if i not in plan.stop_ids]
    assert kept == ids[: len(kept)]  # the survivors are the oldest


def test_step_applies_each_answer_to_the_pool() -> None:
    answers = iter([target(3), target(3), target(1), target(0), target(2)])
    pool = FakePool(["w0"])
    scaler = ProcessScaler(lambda: next(answers), pool, max_workers=8)
    counts = []
    for _ in range(5):
        scaler.step()
        counts.append(len(pool.worker_ids()))
    assert counts == [3, 3, 1, 0, 2]
    assert pool.started == ["w1", "w2", "w3", "w4"]
    assert pool.stopped == ["w2", "w1", "w0"]
    assert scaler.last_target == target(2)


def test_step_keeps_the_workers_when_there_is_no_answer() -> None:
    pool = FakePool(["w0", "w1"])
    plan = ProcessScaler(lambda: None, pool, max_workers=8).step()
    assert plan.is_noop and pool.worker_ids() == ["w0", "w1"]


def _client(handler) -> httpx.Client:  # type: ignore[no-untyped-def]
    return httpx.Client(transport=httpx.MockTransport(handler))


def test_fetch_sends_the_admin_key_and_base_model_and_parses_the_answer() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        body = {"base_model": "lorahost-base", "desired_workers": 2, "live_workers": 1,
                "demand_tokens_per_s": 12.5, "reason": "queue growing"}  # fmt: skip
        return httpx.Response(200, json=body)

    got = fetch_scaling("http://api:8000/", "admin-k", "lorahost-base", client=_client(handler))
    assert got == ScalingTarget("lorahost-base", 2, 1, 12.5, "queue growing")
    [request] = seen
    assert request.url.path == "/v1/admin/scaling"
    assert request.url.params["base_model"] == "lorahost-base"
    assert request.headers["Authorization"] == "Bearer admin-k"


def test_fetch_tolerates_404_errors_and_bad_bodies() -> None:
    for response in (
        httpx.Response(404, json={"detail": "Not Found"}),
        httpx.Response(500, text="boom"),
        httpx.Response(200, json={"desired_workers": 2}),  # no base_model
        httpx.Response(200, content=json.dumps(["not", "an", "object"]).encode()),
    ):
        assert fetch_scaling("http://api", "k", "m", client=_client(lambda _r, resp=response: resp)) is None


def test_fetch_tolerates_an_unreachable_api() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    assert fetch_scaling("http://api", "k", "m", client=_client(handler)) is None


def test_a_scaler_against_an_endpoint_that_404s_keeps_the_current_count() -> None:
    client = _client(lambda _r: httpx.Response(404, json={"detail": "Not Found"}))
    pool = FakePool(["w0", "w1", "w2"])
    scaler = ProcessScaler(lambda: fetch_scaling("http://api", "k", "m", client=client), pool, max_workers=8)
    for _ in range(3):
        assert scaler.step().is_noop
    assert pool.worker_ids() == ["w0", "w1", "w2"] and not pool.started and not pool.stopped


def test_parse_target_rejects_a_non_integer_desired_count() -> None:
    try:
        parse_target({"base_model": "m", "desired_workers": "many"})
    except ValueError as exc:
        assert "desired_workers" in str(exc) or "many" in str(exc)
    else:
        raise AssertionError("a bad desired_workers was accepted")


class FakeModelProcesses:
    """Worker processes of several base models: id -> base model."""

    def __init__(self, workers: dict[str, str]) -> None:
        self.workers = dict(workers)
        self._next = len(workers)

    def model_worker_ids(self, base_model: str) -> list[str]:
        return [w for w, model in self.workers.items() if model == base_model]

    def start_worker(self, *, base_model: str | None = None, wait: bool = True) -> str:
        assert base_model is not None and wait is False
        worker_id = f"w{self._next}"
        self._next += 1
        self.workers[worker_id] = base_model
        return worker_id

    def stop_worker(self, worker: int | str, *, wait: bool = True) -> str:
        assert isinstance(worker, str)
        del self.workers[worker]
        return worker


def test_each_base_model_scales_from_zero_on_its_own() -> None:
    processes = FakeModelProcesses({"w0": "base", "w1": "base"})
    targets = {"base": 0, "wide": 2}
    scalers = {
        model: ProcessScaler(
            lambda model=model: ScalingTarget(model, targets[model], reason="test"),
            ModelWorkers(processes, model),
            max_workers=4,
            interval_s=60,
        )
        for model in targets
    }
    for scaler in scalers.values():
        scaler.step()
    assert sorted(processes.model_worker_ids("wide")) == ["w2", "w3"]  # started from zero for wide only
    assert processes.model_worker_ids("base") == []  # base scaled to zero; wide's workers untouched
