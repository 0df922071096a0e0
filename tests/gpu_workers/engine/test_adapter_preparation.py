"""Cold adapters load off the step loop: an adapter's host copy is read, validated and packed on the copier's
preparer thread while every running request keeps stepping (issue 35, item 4).

The preparation is held by the test (`HeldPreparation`, released by an event), so the checks count steps,
never time: while the host copies of three cold adapters are held, a running stream gets a token at every
step (its largest inter-token gap is one step), the cold requests wait in the "preparing" state, and once
released they finish with the tokens of a resident run. A preparation that fails ends its adapter's
requests alone. `GUARD_S` only bounds how long a held preparation waits before it gives up: on an engine
whose step loop runs the preparation itself, the step blocks there until then and the checks fail.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_workers.engine.async_engine import AsyncLLMEngine
from gpu_workers.engine.errors import AdapterLoadError
from gpu_workers.engine.layers.lora import LoraAdapter
from gpu_workers.engine.llm_engine import LLMEngine
from scheduler.core.engine_request import EngineRequest
from scheduler.core.sampling import SamplingParams
from tests.polling import wait_for

GUARD_S = 10.0  # a deadlock guard, not a speed bound (a step of the tiny model takes milliseconds)
GREEDY = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
LONG = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)  # outlives every check
WARM = "adapter-02"  # the running stream's adapter, on the device from the start
COLD = {"cold-0": "adapter-00", "cold-1": "adapter-01", "cold-3": "adapter-03"}  # cold id -> same files as


class HeldPreparation:
    """Stands in for `AdapterTransfers.prepare_host_copy`: every call waits for `release`, then prepares
    (raising AdapterLoadError for the ids in `failing`). `num_held` counts calls waiting now."""

    def __init__(self, prepare: Callable[[str, Path], LoraAdapter], failing: frozenset[str] = frozenset()):
        self.prepare = prepare
        self.failing = failing
        self.entered = threading.Event()
        self.release = threading.Event()
        self.num_held = 0

    def __call__(self, adapter_id: str, path: Path) -> LoraAdapter:
        self.entered.set()
        self.num_held += 1
        try:
            if not self.release.wait(GUARD_S):
                raise TimeoutError("the held preparation was never released: the test's steps did not run")
        finally:
            self.num_held -= 1
        if adapter_id in self.failing:
            raise AdapterLoadError(f"adapter at {path} is invalid: lora_B holds non-finite values")
        return self.prepare(adapter_id, path)


def hold_preparations(engine: LLMEngine, failing: frozenset[str] = frozenset()) -> HeldPreparation:
    """Hold every host copy preparation of `engine` until the test releases it."""
    held = HeldPreparation(engine.runner.transfers.prepare_host_copy, failing)
    engine.runner.transfers.prepare_host_copy = held  # type: ignore[method-assign]
    return held


def cold_engine(make_engine: Callable[..., LLMEngine], adapter_dirs: dict[str, Path]) -> LLMEngine:
    """The demo adapters on the device; COLD's ids registered on the host only (the same files)."""
    engine = make_engine()
    for cold_id, name in COLD.items():
        engine.register_adapter(cold_id, adapter_dirs[name])
    return engine


def test_a_running_stream_gets_a_token_every_step_while_cold_adapters_are_prepared(
    make_engine: Any, adapter_dirs: dict[str, Path], prompt_ids: list[list[int]]
) -> None:
    engine = cold_engine(make_engine, adapter_dirs)
    want = {c: engine.generate([prompt_ids[3]], GREEDY, [name])[0].token_ids for c, name in COLD.items()}
    held = hold_preparations(engine)
    engine.add_request(EngineRequest("running", prompt_ids[0], LONG, WARM))
    engine.step()  # its prefill
    for cold_id in COLD:
        engine.add_request(EngineRequest(cold_id, prompt_ids[3], GREEDY, cold_id))
    cold_tokens: dict[str, list[int]] = {c: [] for c in COLD}
    num_steps_while_held = 0
    while any(engine.scheduler.get(c) is not None for c in COLD):
        outputs = {out.request_id: out for out in engine.step()}
        assert len(outputs["running"].new_token_ids) == 1  # a token at every step: no gap while they load
        for cold_id in COLD:
            if cold_id in outputs:
                cold_tokens[cold_id] += outputs[cold_id].new_token_ids
        if held.num_held and not held.release.is_set():  # this step ran while a preparation was held
            num_steps_while_held += 1
            assert all(engine.adapter_residency(c) == "preparing" for c in COLD)
            assert not any(cold_tokens.values())  # no host copy yet: nothing of theirs ran
        if num_steps_while_held == 5:
            held.release.set()
    assert num_steps_while_held >= 5  # the running stream stepped while the host copies were held
    assert cold_tokens == want
    stats = engine.engine_stats()
    assert stats.num_adapter_preparations == len(COLD) and stats.adapter_prepare_seconds_total > 0
    assert stats.num_prepare_waits == len(COLD) and stats.num_adapter_load_failures == 0
    engine.abort("running")


def test_a_failing_preparation_fails_only_that_adapters_request(
    make_engine: Any, adapter_dirs: dict[str, Path], prompt_ids: list[list[int]]
) -> None:
    engine = cold_engine(make_engine, adapter_dirs)
    want = engine.generate([prompt_ids[3]], GREEDY, [COLD["cold-1"]])[0].token_ids
    held = hold_preparations(engine, failing=frozenset({"cold-0"}))
    held.release.set()  # prepared at once: "cold-0" fails, "cold-1" loads
    engine.add_request(EngineRequest("running", prompt_ids[0], LONG, WARM))
    engine.step()
    for cold_id in ("cold-0", "cold-1"):
        engine.add_request(EngineRequest(cold_id, prompt_ids[3], GREEDY, cold_id))
    finished: dict[str, Any] = {}
    tokens: list[int] = []
    while engine.scheduler.get("cold-0") is not None or engine.scheduler.get("cold-1") is not None:
        outputs = {out.request_id: out for out in engine.step()}
        assert len(outputs["running"].new_token_ids) == 1
        tokens += outputs["cold-1"].new_token_ids if "cold-1" in outputs else []
        finished |= {r: out for r, out in outputs.items() if out.is_finished}
    failed = finished["cold-0"]
    assert failed.finish_reason == "error" and failed.error_code == "adapter_unavailable"
    assert "'cold-0' could not be loaded" in failed.error and "non-finite" in failed.error
    assert finished["cold-1"].finish_reason == "length" and tokens == want
    assert engine.adapter_residency("cold-0") == "host" and engine.adapter_residency("cold-1") == "device"
    stats = engine.engine_stats()
    assert (stats.num_adapter_load_failures, stats.num_adapter_prepare_failures) == (1, 1)
    assert stats.num_adapter_copy_failures == 0 and stats.num_adapter_preparations == 1
    engine.abort("running")


def test_the_step_loop_thread_streams_tokens_while_a_cold_adapter_is_prepared(
    make_engine: Any, adapter_dirs: dict[str, Path], prompt_ids: list[list[int]]
) -> None:
    engine = cold_engine(make_engine, adapter_dirs)
    want = engine.generate([prompt_ids[3]], GREEDY, [COLD["cold-1"]])[0].token_ids
    held = hold_preparations(engine)
    async_engine = AsyncLLMEngine(engine)

    async def collect(request: EngineRequest) -> list[int]:
        return [t async for out in async_engine.generate_stream(request) for t in out.new_token_ids]

    async def main() -> list[int]:
        running = async_engine.generate_stream(EngineRequest("running", prompt_ids[0], LONG, WARM))
        await anext(running)
        cold = asyncio.create_task(collect(EngineRequest("cold", prompt_ids[3], GREEDY, "cold-1")))
        assert await asyncio.to_thread(held.entered.wait, GUARD_S)
        seq = engine.scheduler.get("running")
        assert seq is not None
        num_at_entry = seq.num_output_tokens
        # the engine thread decodes on while the preparation is held (tokens made, not a queued backlog)
        assert await asyncio.to_thread(wait_for, lambda: seq.num_output_tokens >= num_at_entry + 5, GUARD_S)
        assert held.num_held == 1 and not cold.done()
        held.release.set()
        tokens = await asyncio.wait_for(cold, GUARD_S)
        await running.aclose()
        return tokens

    try:
        assert asyncio.run(main()) == want
    finally:
        held.release.set()
        async_engine.shutdown()
