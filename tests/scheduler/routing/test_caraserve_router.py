from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.routing.caraserve_router import RankAwareRouter, eligible_workers
from scheduler.routing.perf_model import LinearLatency, LoadLatency, PerfModel
from scheduler.routing.router import RouteRequest, RouterOptions, WorkerView
from scheduler.routing.router_policies import ROUTER_POLICIES, make_router

BASE = "base"


def _model(form: str = "sum") -> PerfModel:
    return PerfModel(
        prefill=LinearLatency(5.0, 0.05, 0.0005, rank_form=form, per_token=True),  # type: ignore[arg-type]
        decode=LinearLatency(10.0, 1.0, 0.05, rank_form=form),  # type: ignore[arg-type]
        load=LoadLatency(5.0, 0.1),
    )


def _w(
    worker_id: str,
    running=(),
    waiting=(),
    device=(),
    host=(),
    ready=True,
    base=BASE,
    model=None,
    prompt_tokens=0,
) -> WorkerView:
    return WorkerView(
        worker_id,
        base,
        num_running=len(running),
        num_waiting=len(waiting),
        max_num_seqs=16,
        device_adapters=frozenset(device),
        host_adapters=frozenset(host),
        is_ready=ready,
        running_ranks=tuple(running),
        waiting_ranks=tuple(waiting),
        num_waiting_prompt_tokens=prompt_tokens,
        perf_model=model if model is not None else _model(),
    )


def _req(adapter="x", rank=8, assigned=(), prompt=16, output=100) -> RouteRequest:
    return RouteRequest(
        BASE,
        adapter,
        num_prompt_tokens=prompt,
        predicted_output_tokens=output,
        adapter_rank=rank,
        assigned_workers=tuple(assigned),
    )


def test_low_rank_request_avoids_the_worker_running_rank_128_requests_under_a_max_rank_kernel() -> None:
    high = _w("a", running=(128, 128), device={"x"}, model=_model("max"))
    low = _w("b", running=(8, 8), device={"x"}, model=_model("max"))
    assert RankAwareRouter().choose(_req(rank=8), [high, low]) == "b"
    # the v1 router's tie-break (same load, same residency) would have picked "a"
    assert make_router("residency_least_loaded").choose(_req(rank=8), [high, low]) == "a"


def test_under_a_sum_kernel_the_rank_mix_does_not_matter_but_the_load_does() -> None:
    high = _w("a", running=(128,), device={"x"})
    low = _w("b", running=(8, 8), device={"x"})
    assert RankAwareRouter(slo_tpot_ms=100.0).choose(_req(rank=8), [high, low]) == "a"


def test_assigned_workers_are_respected_even_when_another_is_idle() -> None:
    workers = [_w("a", device={"x"}), _w("b", running=(8, 8, 8), device={"x"}), _w("c", running=(8,))]
    assert RankAwareRouter().choose(_req(assigned=[("b", 0.5), ("c", 0.5)]), workers) == "c"
    assert RankAwareRouter().choose(_req(assigned=[("b", 1.0)]), workers) == "b"


def test_dead_assigned_workers_fall_back_to_every_ready_worker() -> None:
    workers = [_w("a", running=(8,)), _w("b"), _w("c", ready=False)]
    assert RankAwareRouter().choose(_req(assigned=[("gone", 0.6), ("c", 0.4)]), workers) == "b"
    assert [w.worker_id for w, _ in eligible_workers(_req(assigned=[("gone", 1.0)]), workers)] == ["a", "b"]


def test_empty_worker_scores_zero_and_ties_prefer_residency_then_weight_then_id() -> None:
    router = RankAwareRouter()
    busy = _w("a", running=(8,), device={"x"})
    empty_resident = _w("z", device={"x"})
    assert router.choose(_req(), [busy, empty_resident]) == "z"
    assert router.score(_req(), empty_resident).score == 0.0
    # two empty workers with the adapter on the device: the higher placement weight, then the lower id
    both = [_w("b", device={"x"}), _w("c", device={"x"})]
    assert router.choose(_req(assigned=[("b", 0.3), ("c", 0.7)]), both) == "c"
    assert router.choose(_req(), both) == "b"
    # base-model requests: every empty worker scores 0, the lowest id wins
    assert router.choose(_req(adapter=None, rank=0), [_w("d"), _w("c")]) == "c"


def test_empty_cold_worker_pays_the_adapter_load() -> None:
    router = RankAwareRouter(cold_fetch_ms=50.0)
    cold, host, device = _w("a"), _w("b", host={"x"}), _w("c", running=(8,), device={"x"})
    scores = {s.worker_id: s for s in router.scores(_req(rank=64), [cold, host, device])}
    assert scores["a"].residency_ms == 5.0 + 0.1 * 64 + 50.0
    assert scores["b"].residency_ms == 5.0 + 0.1 * 64
    assert scores["c"].residency_ms == 0.0
    assert scores["b"].score < scores["a"].score
    # spread over 100 output tokens, a 61 ms load costs less than slowing one running request's decode
    assert router.choose(_req(rank=64), [cold, device]) == "a"
    # with an expensive fetch, one light request on a resident worker beats the cold load; many do not
    router = RankAwareRouter(cold_fetch_ms=1000.0)
    assert router.choose(_req(rank=64), [cold, device]) == "c"
    crowded = _w("c", running=(8,) * 12, device={"x"})
    assert router.choose(_req(rank=64), [cold, crowded]) == "a"


def test_slo_penalty_flips_the_choice() -> None:
    few_high = _w("b", running=(64, 64), device={"x"})
    many_low = _w("a", running=(8, 8, 8), device={"x"})
    assert RankAwareRouter(slo_tpot_ms=100.0).choose(_req(rank=8), [many_low, few_high]) == "b"
    # b's decode step with the request would be 10 + 3 + 0.05 * 136 = 19.8 ms > 17 ms; a's is 15.6 ms
    assert RankAwareRouter(slo_tpot_ms=17.0).choose(_req(rank=8), [many_low, few_high]) == "a"


def test_default_slo_is_one_and_a_half_single_request_decode_steps() -> None:
    # default SLO at rank 8: 1.5 x (10 + 1 + 0.4) = 17.1 ms; b's step would be 19.8 ms (penalised), a's 15.6
    few_high = _w("b", running=(64, 64), device={"x"})
    many_low = _w("a", running=(8, 8, 8), device={"x"})
    assert RankAwareRouter().choose(_req(rank=8), [many_low, few_high]) == "a"


def test_joining_a_prefill_queue_skips_the_step_intercept() -> None:
    queued = _w("a", waiting=(8,), prompt_tokens=200, device={"x"})
    running = _w("b", running=(8,), device={"x"})
    router = RankAwareRouter()
    # dPrefill with a queue is the request's tokens only; on an empty queue it includes the 5 ms step
    difference = (
        router.score(_req(), running).cost_per_token_ms - router.score(_req(), queued).cost_per_token_ms
    )
    assert abs(difference - 5.0 / 100) < 1e-9
    assert router.choose(_req(), [queued, running]) == "a"


def test_under_a_max_rank_kernel_a_queue_of_high_rank_prompts_costs_more() -> None:
    high = _w("a", waiting=(128,), prompt_tokens=2000, device={"x"}, model=_model("max"))
    low = _w("b", waiting=(8,), prompt_tokens=2000, device={"x"}, model=_model("max"))
    assert RankAwareRouter(slo_tpot_ms=100.0).choose(_req(rank=8), [high, low]) == "b"


def test_workers_without_a_perf_model_use_the_default() -> None:
    plain = WorkerView("a", BASE, num_running=2, max_num_seqs=8)
    assert RankAwareRouter().score(_req(), plain).total > 0


def test_no_ready_worker_returns_none() -> None:
    assert RankAwareRouter().choose(_req(), [_w("a", ready=False), _w("b", base="other")]) is None


def test_rank_aware_is_registered_and_configured_from_options() -> None:
    assert ROUTER_POLICIES["rank_aware"] is RankAwareRouter
    router = make_router("rank_aware", RouterOptions(slo_tpot_ms=25.0, cold_fetch_ms=7.0))
    assert router == RankAwareRouter(slo_tpot_ms=25.0, cold_fetch_ms=7.0)


_worker_ids = st.sampled_from(["w0", "w1", "w2", "w3", "w4"])
_ranks = st.sampled_from([0, 8, 16, 64, 128])


@st.composite
def _workers(draw: st.DrawFn) -> list[WorkerView]:
    ids = draw(st.lists(_worker_ids, unique=True, max_size=5))
    return [
        _w(
            worker_id,
            running=draw(st.lists(_ranks, max_size=6)),
            waiting=draw(st.lists(_ranks, max_size=4)),
            device=draw(st.sets(st.sampled_from(["x", "y"]))),
            host=draw(st.sets(st.sampled_from(["x", "y"]))),
            ready=draw(st.booleans()),
            base=draw(st.sampled_from([BASE, "other"])),
            model=draw(st.sampled_from([_model("sum"), _model("max")])),
            prompt_tokens=draw(st.integers(0, 4000)),
        )
        for worker_id in ids
    ]


@settings(max_examples=300, deadline=None)
@given(
    workers=_workers(),
    assigned=st.lists(st.tuples(_worker_ids, st.floats(0.0, 1.0)), max_size=4),
    rank=_ranks,
    slo=st.none() | st.floats(1.0, 100.0),
    prompt=st.integers(0, 2000),
)
def test_choice_is_ready_of_the_base_model_and_assigned_when_an_assigned_worker_is_live(
    workers, assigned, rank, slo, prompt
) -> None:
    request = _req(rank=rank, assigned=assigned, prompt=prompt)
    chosen = RankAwareRouter(slo_tpot_ms=slo).choose(request, workers)
    ready = {w.worker_id for w in workers if w.is_ready and w.base_model == BASE}
    if not ready:
        assert chosen is None
        return
    assert chosen in ready
    live_assigned = ready & {worker_id for worker_id, _ in assigned}
    if live_assigned:
        assert chosen in live_assigned
    assert RankAwareRouter(slo_tpot_ms=slo).choose(request, list(reversed(workers))) == chosen  # order-free
