from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.routing.caraserve_router import RankAwareRouter
from scheduler.routing.router import (
    DORA,
    VOCAB_LORA,
    PlacementWeightedRandom,
    ResidencyThenLeastLoaded,
    RouteRequest,
    WorkerView,
    adapter_engine_features,
    engine_feature_refusal,
    rank_limit_refusal,
    residency_tier,
    tenant_load,
)

BASE = "base"


def _w(worker_id: str, running: int = 0, device=(), host=(), ready=True, base=BASE) -> WorkerView:
    return WorkerView(
        worker_id,
        base,
        num_running=running,
        max_num_seqs=8,
        device_adapters=frozenset(device),
        host_adapters=frozenset(host),
        is_ready=ready,
    )


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


def test_an_adapter_goes_only_to_workers_whose_engine_takes_its_rank() -> None:
    small, large = (
        replace(_w("a", device={"x"}), max_lora_rank=16),
        replace(_w("b", running=6), max_lora_rank=64),
    )
    unlimited = _w("c", running=7)  # publishes no limit
    for router in (ResidencyThenLeastLoaded(), PlacementWeightedRandom(seed=1), RankAwareRouter()):
        assert router.choose(RouteRequest(BASE, "x", adapter_rank=32), [small, large]) == "b"
        assert router.choose(RouteRequest(BASE, "x", adapter_rank=128), [small, large, unlimited]) == "c"
    assert ResidencyThenLeastLoaded().choose(RouteRequest(BASE, "x", adapter_rank=16), [small, large]) == "a"
    assert ResidencyThenLeastLoaded().choose(RouteRequest(BASE, None), [small, large]) == "a"


def test_a_rank_no_ready_worker_takes_is_refused_naming_the_largest_limit() -> None:
    small, large = replace(_w("a"), max_lora_rank=16), replace(_w("b"), max_lora_rank=64)
    message = rank_limit_refusal(RouteRequest(BASE, "x", adapter_rank=128), [small, large])
    assert message is not None and "rank 128" in message and "max_lora_rank 64" in message
    assert rank_limit_refusal(RouteRequest(BASE, "x", adapter_rank=64), [small, large]) is None
    assert rank_limit_refusal(RouteRequest(BASE, "x", adapter_rank=128), [small, _w("c")]) is None  # no limit
    # no ready worker of the base model: a cold start, the request waits (the next worker may take it)
    assert (
        rank_limit_refusal(RouteRequest(BASE, "x", adapter_rank=128), [replace(large, is_ready=False)])
        is None
    )


def test_router_policies_are_chosen_by_name() -> None:
    from scheduler.routing.router_policies import DEFAULT_ROUTER_POLICY, ROUTER_POLICIES, make_router

    assert isinstance(make_router(), ROUTER_POLICIES[DEFAULT_ROUTER_POLICY])
    assert isinstance(make_router("residency_least_loaded"), ResidencyThenLeastLoaded)


def test_an_unknown_router_policy_names_the_choices() -> None:
    import pytest

    from scheduler.routing.router_policies import make_router

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

    from scheduler.routing.router import PlacementWeightedRandom
    from scheduler.routing.router_policies import make_router

    workers = [_w("a"), _w("b", running=7), _w("c")]
    request = RouteRequest(BASE, "x", assigned_workers=(("a", 0.8), ("b", 0.2)))
    router = PlacementWeightedRandom(seed=1)
    counts = Counter(router.choose(request, workers) for _ in range(2000))
    assert set(counts) == {"a", "b"}  # blind to b's load, never c
    assert 0.75 < counts["a"] / 2000 < 0.85
    assert isinstance(make_router("placement_weighted"), PlacementWeightedRandom)
    assert router.choose(RouteRequest(BASE, "x"), [_w("a", ready=False)]) is None


# ---- the load a tenant sees under fair share (tenant_load) ---------------------------------------------------


def _queued(
    worker_id: str, running: int, by_tenant: dict[str, int], device=(), max_num_seqs: int = 8
) -> WorkerView:
    return WorkerView(
        worker_id,
        BASE,
        num_running=running,
        num_waiting=sum(by_tenant.values()),
        max_num_seqs=max_num_seqs,
        device_adapters=frozenset(device),
        num_waiting_by_tenant=by_tenant,
    )


def test_a_flooding_tenants_backlog_does_not_push_a_light_tenants_request_off_a_worker_with_free_slots() -> (
    None
):
    """Worker x has free slots and 30 of the flooder's requests queued; y is busier but has no queue. The light
    tenant's request waits on x only for about one of the flooder's (fair share interleaves them), so it goes to
    x; the flooder's own next request waits behind its 30 and goes to y. Without the tenant (today's estimate)
    both go to y."""
    x, y = _queued("x", 2, {"flood": 30}), _queued("y", 4, {})
    router = ResidencyThenLeastLoaded()
    assert router.choose(RouteRequest(BASE, tenant_id="light"), [x, y]) == "x"
    assert router.choose(RouteRequest(BASE, tenant_id="flood"), [x, y]) == "y"
    assert router.choose(RouteRequest(BASE), [x, y]) == "y"
    assert tenant_load(x, "light") == (2 + 1) / 8 and tenant_load(x, "flood") == x.load == (2 + 30) / 8


def test_tenant_load_counts_each_other_tenant_up_to_one_more_than_the_tenants_own_queue() -> None:
    worker = _queued("x", 1, {"a": 2, "b": 10, "c": 1})
    assert tenant_load(worker, "a") == (1 + 2 + 3 + 1) / 8  # a's 2, then b and a alternate: 3 of b's, c's 1
    assert tenant_load(worker, "c") == (1 + 1 + 2 + 2) / 8
    assert tenant_load(worker, "new") == (1 + 1 + 1 + 1) / 8
    assert tenant_load(worker, "b") == worker.load


workers_st = st.lists(
    st.builds(
        _queued,
        worker_id=st.sampled_from("abcdef"),
        running=st.integers(0, 8),
        by_tenant=st.dictionaries(st.sampled_from(["t1", "t2", "t3", ""]), st.integers(1, 40), max_size=4),
        device=st.sets(st.sampled_from(["x", "y"])),
        max_num_seqs=st.integers(1, 8),
    ),
    max_size=5,
)
tenant_st = st.sampled_from(["t1", "t2", "t3", "t4", ""])


@given(workers=workers_st, tenant=tenant_st, adapter=st.sampled_from([None, "x", "y"]))
def test_without_per_tenant_data_the_choice_is_todays(
    workers: list[WorkerView], tenant: str, adapter: str | None
) -> None:
    """Workers that publish no queue per tenant (older workers, other backends) are routed as before: residency,
    then (running + queued) / slots, then id; so is a request without a tenant when they do publish it."""
    today = min(
        workers,
        key=lambda w: (residency_tier(RouteRequest(BASE, adapter), w), w.load, w.worker_id),
        default=None,
    )
    expected = today.worker_id if today else None
    unpublished = [replace(w, num_waiting_by_tenant={}) for w in workers]
    assert (
        ResidencyThenLeastLoaded().choose(RouteRequest(BASE, adapter, tenant_id=tenant), unpublished)
        == expected
    )
    assert ResidencyThenLeastLoaded().choose(RouteRequest(BASE, adapter), workers) == expected


@given(workers=workers_st, tenant=tenant_st)
def test_tenant_load_is_between_the_running_load_and_the_full_load(
    workers: list[WorkerView], tenant: str
) -> None:
    for worker in workers:
        running = worker.num_running / worker.max_num_seqs
        assert running <= tenant_load(worker, tenant) <= worker.load
        if worker.num_waiting_by_tenant.get(tenant, 0) >= max(
            worker.num_waiting_by_tenant.values(), default=0
        ):
            assert tenant_load(worker, tenant) == worker.load  # the biggest backlog waits for everyone's


@given(
    running=st.integers(0, 8),
    others=st.dictionaries(st.sampled_from(["t2", "t3"]), st.integers(1, 40), max_size=2),
    flood=st.integers(1, 500),
    extra=st.integers(1, 500),
)
def test_a_flooders_backlog_size_does_not_change_another_tenants_load(
    running: int, others: dict[str, int], flood: int, extra: int
) -> None:
    """A light tenant (nothing queued) sees a flooder's backlog as one request, however long it grows; the
    flooder sees all of it."""
    before = _queued("x", running, {**others, "flood": flood})
    after = _queued("x", running, {**others, "flood": flood + extra})
    assert tenant_load(after, "light") == tenant_load(before, "light")
    assert tenant_load(after, "flood") > tenant_load(before, "flood")


@pytest.mark.parametrize(
    ("features", "says"),
    [
        (frozenset({DORA}), "DoRA"),
        (frozenset({VOCAB_LORA}), "embed_tokens / lm_head"),
    ],
)
def test_an_adapter_needing_an_engine_feature_goes_only_to_engines_serving_it_and_is_refused_where_none_is_ready(
    features: frozenset[str], says: str
) -> None:
    vllm, native = replace(_w("a", device={"x"}), engine_backend="vllm"), replace(_w("b", running=6))
    needy = RouteRequest(BASE, "x", adapter_rank=8, engine_features=features)
    for router in (ResidencyThenLeastLoaded(), PlacementWeightedRandom(seed=1), RankAwareRouter()):
        assert router.choose(needy, [vllm, native]) == "b"
        assert router.choose(needy, [vllm]) is None
    plain = RouteRequest(BASE, "x", adapter_rank=8)
    assert ResidencyThenLeastLoaded().choose(plain, [vllm, native]) == "a"  # plain LoRA: where it is resident
    message = engine_feature_refusal(needy, [vllm])
    assert message is not None and says in message and "vllm" in message and "native" in message
    assert engine_feature_refusal(needy, [vllm, native]) is None
    assert engine_feature_refusal(RouteRequest(BASE, "x", adapter_rank=8), [vllm]) is None
    assert engine_feature_refusal(needy, [replace(vllm, is_ready=False)]) is None  # a cold start waits


def test_an_adapters_engine_features_come_from_its_validated_metadata() -> None:
    assert adapter_engine_features(False, ("q_proj", "v_proj")) == frozenset()
    assert adapter_engine_features(True, ("q_proj",)) == {DORA}
    assert adapter_engine_features(False, ("q_proj", "lm_head")) == {VOCAB_LORA}
    assert adapter_engine_features(False, ("embed_tokens",)) == {VOCAB_LORA}
