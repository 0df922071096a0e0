"""Continuous batching, chunked prefill, preemption and KV pressure give the same tokens as running alone."""

from __future__ import annotations

from typing import Any

from gpu_workers.engine.llm_engine import LLMEngine
from scheduler.admission.fair_share import base_policy
from scheduler.core.engine_request import EngineRequest
from scheduler.core.sampling import SamplingParams
from scheduler.multiqueue.multiqueue import MultiQueuePolicy

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
ADAPTERS = [None, "adapter-00", "adapter-02", "adapter-03"]


def run_alone(engine: LLMEngine, prompt: list[int], adapter: str | None) -> list[int]:
    return engine.generate([prompt], GREEDY, adapter_ids=[adapter])[0].token_ids


def drain(engine: LLMEngine) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return tokens


def test_requests_joining_and_leaving_mid_stream_match_running_alone(
    fp32_engine: LLMEngine, prompt_ids: list[list[int]]
) -> None:
    expected = {f"r{i}": run_alone(fp32_engine, prompt_ids[i], ADAPTERS[i]) for i in range(4)}
    tokens: dict[str, list[int]] = {}
    fp32_engine.add_request(EngineRequest("r0", prompt_ids[0], GREEDY, ADAPTERS[0]))
    fp32_engine.add_request(
        EngineRequest(
            "r1", prompt_ids[1], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True), ADAPTERS[1]
        )
    )
    for step in range(30):
        if step == 3:
            fp32_engine.add_request(EngineRequest("r2", prompt_ids[2], GREEDY, ADAPTERS[2]))
        if step == 7:
            fp32_engine.add_request(EngineRequest("r3", prompt_ids[3], GREEDY, ADAPTERS[3]))
        for out in fp32_engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    tokens.update({k: tokens.get(k, []) + v for k, v in drain(fp32_engine).items()})
    assert tokens["r1"] == expected["r1"][:5]
    for rid in ("r0", "r2", "r3"):
        assert tokens[rid] == expected[rid], rid


def test_chunked_prefill_gives_the_same_tokens_as_unchunked(
    make_engine: Any, fp32_engine: LLMEngine, prompt_ids: list[list[int]]
) -> None:
    chunked = make_engine(max_num_batched_tokens=7)
    prompts = [prompt_ids[3], prompt_ids[1], prompt_ids[3]]
    adapters = ["adapter-01", None, "adapter-04"]
    expected = fp32_engine.generate(prompts, GREEDY, adapter_ids=adapters)
    got = chunked.generate(prompts, GREEDY, adapter_ids=adapters)
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]
    assert chunked.engine_stats().num_steps > GREEDY.max_tokens  # prompts really were split into chunks


def test_full_kv_budget_queues_requests_and_preempts_without_failing(
    make_engine: Any, fp32_engine: LLMEngine, prompt_ids: list[list[int]]
) -> None:
    # 24 KV slots for four ~20-token sequences; the adapters in their own share (static split)
    small = make_engine(num_kv_blocks=6, block_size=4, memory_mode="static")
    prompts = [prompt_ids[i % 3] for i in range(4)]
    expected = fp32_engine.generate(prompts, GREEDY, adapter_ids=ADAPTERS)
    got = small.generate(prompts, GREEDY, adapter_ids=ADAPTERS)
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]
    assert small.engine_stats().num_free_kv_blocks == 6  # free or cached and unreferenced: nothing leaked
    assert small.engine_stats().num_preemptions > 0


def test_max_num_seqs_limits_the_batch(make_engine: Any, prompt_ids: list[list[int]]) -> None:
    engine = make_engine(max_num_seqs=2)
    for i in range(4):
        engine.add_request(EngineRequest(f"r{i}", prompt_ids[i], GREEDY))
    engine.step()
    assert engine.engine_stats().num_running == 2 and engine.engine_stats().num_waiting == 2
    assert len(drain(engine)) == 4


def test_sjf_admits_the_shortest_predicted_request_first_with_unchanged_tokens(
    make_engine: Any, fp32_engine: LLMEngine, prompt_ids: list[list[int]]
) -> None:
    engine = make_engine(batch_policy="sjf", max_num_seqs=1)
    predictions = {"long": 12, "short": 2, "mid": 6}
    for i, (request_id, predicted) in enumerate(predictions.items()):
        engine.add_request(
            EngineRequest(request_id, prompt_ids[i], GREEDY, predicted_output_tokens=predicted)
        )
    first_tokens: list[str] = []
    tokens: dict[str, list[int]] = {r: [] for r in predictions}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.new_token_ids and not tokens[out.request_id]:
                first_tokens.append(out.request_id)
            tokens[out.request_id] += out.new_token_ids
    assert first_tokens == ["short", "mid", "long"]  # one sequence at a time, by predicted output
    want = fp32_engine.generate([prompt_ids[i] for i in range(3)], GREEDY)
    assert [tokens[r] for r in predictions] == [o.token_ids for o in want]


def test_multiqueue_gives_the_same_tokens_as_fifo(make_engine: Any, prompt_ids: list[list[int]]) -> None:
    prompts = [prompt_ids[i % 4] for i in range(6)]
    adapters = [ADAPTERS[i % 4] for i in range(6)]
    fifo = make_engine(num_kv_blocks=16, block_size=4, max_num_seqs=3, memory_mode="static")
    multiqueue = make_engine(
        num_kv_blocks=16, block_size=4, max_num_seqs=3, memory_mode="static", batch_policy="multiqueue"
    )
    assert isinstance(base_policy(multiqueue.scheduler.policy), MultiQueuePolicy)
    want = fifo.generate(prompts, GREEDY, adapter_ids=adapters)
    got = multiqueue.generate(prompts, GREEDY, adapter_ids=adapters)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert sum(base_policy(multiqueue.scheduler.policy).charged_tokens()) == 0  # every charge was returned


def first_token_order(engine: LLMEngine) -> list[str]:
    """Request ids in the order their first token came out, stepping the engine until it is idle."""
    order: list[str] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.new_token_ids and out.request_id not in order:
                order.append(out.request_id)
    return order


def test_one_tenants_queue_does_not_delay_another_tenants_request(
    make_engine: Any, prompt_ids: list[list[int]]
) -> None:
    """Tenant a queues 12 requests, then tenant b sends one: b is admitted at the next free slot (fair share,
    on by default), not after a's whole queue (the FIFO order alone)."""
    orders = {}
    for is_fair in (True, False):
        engine = make_engine(max_num_seqs=2, fair_share=is_fair)
        for i in range(12):
            engine.add_request(EngineRequest(f"a{i}", prompt_ids[i % 4], GREEDY, tenant_id="tenant-a"))
        engine.step()
        engine.add_request(EngineRequest("b0", prompt_ids[0], GREEDY, tenant_id="tenant-b"))
        orders[is_fair] = first_token_order(engine)
    assert orders[True].index("b0") <= 3  # a0 and a1 ran; b0 is level with a and goes with or after a2
    assert orders[False].index("b0") == 12  # without fair share it waits for all of a's queue


def test_a_reserved_slot_lets_a_newcomer_start_at_the_next_step_while_a_flood_fills_the_batch(
    make_engine: Any, prompt_ids: list[list[int]]
) -> None:
    """With fair share's reserved slot (engine default 1) tenant a's backlog takes 3 of 4 slots; b's request,
    arriving while a's run, gets its first token from the very next step. Without the reserve it waits until
    one of a's requests finishes."""
    first_steps = {}
    for num_reserved in (1, 0):
        engine = make_engine(max_num_seqs=4, fair_share_reserved_seqs=num_reserved)
        for i in range(12):
            engine.add_request(EngineRequest(f"a{i}", prompt_ids[i % 4], GREEDY, tenant_id="tenant-a"))
        engine.step()
        engine.step()
        assert len(engine.scheduler.running) == 4 - num_reserved
        engine.add_request(EngineRequest("b0", prompt_ids[0], GREEDY, tenant_id="tenant-b"))
        num_steps = 1
        while not any(out.request_id == "b0" and out.new_token_ids for out in engine.step()):
            num_steps += 1
        first_steps[num_reserved] = num_steps
    assert first_steps[1] == 1
    assert first_steps[0] > 1


def served_while_both_backlogged(engine: LLMEngine) -> tuple[dict[str, int], list[str]]:
    """Output tokens served per tenant ("a", "b": the request id's first letter), and the request ids in the
    order of their first token, until one tenant has no request left waiting (both backlogged until then)."""
    served, order = {"a": 0, "b": 0}, []
    while {s.tenant_id for s in engine.scheduler.waiting.values()} == {"a", "b"}:
        for out in engine.step():
            served[out.request_id[0]] += len(out.new_token_ids)
            if out.new_token_ids and out.request_id not in order:
                order.append(out.request_id)
    return served, order


def test_tenants_of_weight_two_and_one_are_served_two_to_one_while_both_are_backlogged(
    make_engine: Any, prompt_ids: list[list[int]]
) -> None:
    """Weighted fair share (a plan's fair_share_weight reaches add_request as tenant_weight): tenant a of
    weight 2 gets twice b's output tokens while both have requests waiting (same prompts and lengths), within
    one batch of outputs, and two of every three admissions."""
    max_num_seqs = 3
    engine = make_engine(max_num_seqs=max_num_seqs)
    for i in range(24):
        engine.add_request(EngineRequest(f"a{i}", prompt_ids[0], GREEDY, tenant_id="a", tenant_weight=2.0))
        engine.add_request(EngineRequest(f"b{i}", prompt_ids[0], GREEDY, tenant_id="b", tenant_weight=1.0))
    served, order = served_while_both_backlogged(engine)
    assert served["b"] > 0
    assert abs(served["a"] - 2 * served["b"]) <= max_num_seqs * GREEDY.max_tokens
    num_a = sum(request_id.startswith("a") for request_id in order)
    assert abs(num_a - 2 * (len(order) - num_a)) <= max_num_seqs
    policy = engine.scheduler.policy
    bound = (
        len(prompt_ids[0]) + 2 * max_num_seqs * GREEDY.max_tokens
    )  # scheduler/admission/fair_share.py, w_min = 1
    assert abs(policy.counter("a") - policy.counter("b")) <= bound
    drain(engine)


def test_multi_step_windows_give_the_tokens_of_a_plan_per_step(
    make_engine: Any, fp32_engine: LLMEngine, prompt_ids: list[list[int]]
) -> None:
    """num_scheduler_steps 8: decodes run in windows (a request added mid-stream ends one; stop strings and
    EOS are checked per token as before), greedy tokens equal the single-step engine's."""
    multi = make_engine(num_scheduler_steps=8)
    params = [GREEDY, SamplingParams(max_tokens=9, temperature=0), GREEDY]
    expected = fp32_engine.generate(prompt_ids[:3], params, adapter_ids=ADAPTERS[:3])
    got: dict[str, list[int]] = {}
    multi.add_request(EngineRequest("m0", prompt_ids[0], params[0], ADAPTERS[0]))
    multi.add_request(EngineRequest("m1", prompt_ids[1], params[1], ADAPTERS[1]))
    for step in range(40):
        if step == 5:
            multi.add_request(EngineRequest("m2", prompt_ids[2], params[2], ADAPTERS[2]))
        for out in multi.step():
            got.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert multi.scheduler.window.num_window_steps > 0
    assert [got[f"m{i}"] for i in range(3)] == [e.token_ids for e in expected]
