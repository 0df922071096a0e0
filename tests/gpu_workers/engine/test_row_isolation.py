"""One request's numeric overflow fails only that request: batch neighbours keep their exact tokens.

The overflowing adapter is built directly at the engine level (every weight 3e38, bypassing validation), so
these tests exercise the engine's isolation, not the validator (tests/registry/test_value_bounds.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from gpu_workers.engine.async_engine import AsyncLLMEngine
from gpu_workers.engine.errors import NumericOverflowError
from gpu_workers.engine.layers.lora import (
    LoraAdapter,
    LoraBatch,
    LoraProjection,
    LoraSegment,
    SegmentedStep,
    add_lora_delta,
)
from gpu_workers.engine.layers.stacked_lora import StackedStep, build_stacked_lora, stacked_masks
from gpu_workers.engine.llm_engine import LLMEngine
from scheduler.core.engine_request import EngineRequest
from scheduler.core.sampling import SamplingParams

HUGE = 3e38
GOOD_ADAPTER = "adapter-02"  # targets every module, so every projection has a stacked neighbour


def overflowing_copy(adapter: LoraAdapter, adapter_id: str, value: float = HUGE) -> LoraAdapter:
    """`adapter` with every lora_A / scaled lora_B value set to `value` (finite in fp32, overflows in use)."""
    layers = tuple(
        {
            name: LoraProjection(
                a_t=torch.full_like(proj.a_t, value),
                parts=tuple((*part[:4], torch.full_like(part[4], value)) for part in proj.parts),
            )
            for name, proj in layer.items()
        }
        for layer in adapter.layers
    )
    return LoraAdapter(
        adapter_id, adapter.rank, adapter.scale, adapter.target_modules, layers, adapter.num_bytes
    )


@pytest.fixture(scope="module")
def engine(make_engine: Any) -> Iterator[LLMEngine]:
    """An fp32 engine with the demo adapters and `huge` (an overflowing copy of GOOD_ADAPTER)."""
    eng = make_engine()
    eng.install_adapter(overflowing_copy(eng.runner.adapters[GOOD_ADAPTER], "huge"))
    yield eng


@pytest.fixture(params=["stacked", "segments", "kernel"])
def lora_form(request: pytest.FixtureRequest, engine: LLMEngine) -> Iterator[str]:
    """Force the stacked (owner-masked), the per-segment or the CPU-kernel multi-LoRA form for every
    multi-adapter step."""
    from dataclasses import replace

    from gpu_workers.engine.layers.lora_kernel import is_kernel_usable

    forms = engine.runner.lora_forms
    uses_kernel, plan = forms.use_lora_kernel, forms.kernel_plan
    if request.param == "kernel":
        if not is_kernel_usable(engine.runner.device, engine.runner.dtype):
            pytest.skip("the LoRA CPU kernel is not available here")
        forms.use_lora_kernel = True
        forms.kernel_plan = replace(plan, decode_lora="kernel")
    else:
        forms.use_lora_kernel = False
        forms.kernel_plan = replace(plan, decode_lora="stacked")  # the stacked rule below decides
        forms._use_stacked = (
            (lambda segments, n: len(segments) >= 2)
            if request.param == "stacked"
            else (lambda segments, n: False)
        )
    yield request.param
    forms.use_lora_kernel, forms.kernel_plan = uses_kernel, plan
    forms.__dict__.pop("_use_stacked", None)


def _params(temperature: float, max_tokens: int = 8) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=7, ignore_eos=True)


Request = tuple[str, list[int], SamplingParams, str | None]  # (id, prompt, params, adapter)


def _run(engine: LLMEngine, requests: list[Request]) -> dict[str, Any]:
    """Add the requests in order, step to completion; request id -> (tokens, finish_reason, error, code)."""
    for request_id, prompt, params, adapter in requests:
        engine.add_request(EngineRequest(request_id, prompt, params, adapter))
    tokens: dict[str, list[int]] = {r[0]: [] for r in requests}
    result: dict[str, Any] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
            if out.is_finished:
                result[out.request_id] = (
                    tokens[out.request_id],
                    out.finish_reason,
                    out.error,
                    out.error_code,
                )
    return result


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_overflowing_adapter_fails_only_its_own_request(
    engine: LLMEngine, lora_form: str, prompt_ids: list[list[int]], temperature: float
) -> None:
    good_prompt, bad_prompt = prompt_ids[2], prompt_ids[3]  # bad is longer: the good row's decode pads
    alone = _run(engine, [("alone", good_prompt, _params(temperature), GOOD_ADAPTER)])["alone"]

    # bad first, so it owns block 0 (the decode padding page of shorter rows)
    got = _run(
        engine,
        [
            ("bad", bad_prompt, _params(temperature), "huge"),
            ("good", good_prompt, _params(temperature), GOOD_ADAPTER),
            ("base", prompt_ids[0], _params(temperature), None),
        ],
    )

    assert got["good"] == alone
    assert got["base"][1] == "length" and len(got["base"][0]) == 8
    tokens, reason, error, code = got["bad"]
    assert reason == "error" and tokens == [] and code == "numeric_overflow"
    assert "huge" in error and "overflow" in error


def test_kv_pages_left_by_an_overflowing_request_do_not_poison_the_next_one(
    engine: LLMEngine, prompt_ids: list[list[int]]
) -> None:
    before = _run(engine, [("before", prompt_ids[1], _params(0.0, 20), GOOD_ADAPTER)])["before"]
    bad = _run(engine, [("bad", prompt_ids[3], _params(0.0, 20), "huge")])["bad"]
    after = _run(engine, [("after", prompt_ids[1], _params(0.0, 20), GOOD_ADAPTER)])["after"]
    assert bad[1] == "error"
    assert after == before


def test_tiny_temperature_samples_the_argmax_instead_of_failing_the_batch(
    engine: LLMEngine, prompt_ids: list[list[int]]
) -> None:
    greedy = _run(engine, [("greedy", prompt_ids[0], _params(0.0), None)])["greedy"]
    got = _run(
        engine,
        [
            ("tiny", prompt_ids[0], _params(1e-45), None),
            ("other", prompt_ids[1], _params(1.0), "adapter-00"),
        ],
    )
    assert got["tiny"] == greedy
    assert got["other"][1] == "length"


def test_async_stream_of_an_overflowing_request_raises_and_neighbours_finish(
    engine: LLMEngine, prompt_ids: list[list[int]]
) -> None:
    async_engine = AsyncLLMEngine(engine)

    async def collect(request_id: str, prompt: list[int], adapter: str) -> tuple[list[int], str | None]:
        ids: list[int] = []
        reason = None
        async for out in async_engine.generate_stream(
            EngineRequest(request_id, prompt, _params(1.0), adapter)
        ):
            ids.extend(out.new_token_ids)
            reason = out.finish_reason
        return ids, reason

    async def main() -> list[Any]:
        return await asyncio.gather(
            collect("bad", prompt_ids[3], "huge"),
            collect("good", prompt_ids[2], GOOD_ADAPTER),
            return_exceptions=True,
        )

    try:
        bad, good = asyncio.run(main())
    finally:
        async_engine.shutdown()
    assert isinstance(bad, NumericOverflowError) and "huge" in str(bad) and bad.code == "numeric_overflow"
    assert isinstance(bad, ValueError)  # the worker reports it as bad_request, naming the adapter
    assert good == (_run(engine, [("solo", prompt_ids[2], _params(1.0), GOOD_ADAPTER)])["solo"][0], "length")


# ---------------------------------------------------------------------------------------------------------
# The stacked form at the layer level


@pytest.mark.parametrize("value", [HUGE, float("inf"), float("nan")])
def test_stacked_delta_of_a_normal_row_ignores_an_overflowing_neighbour(
    engine: LLMEngine, value: float
) -> None:
    good = engine.runner.adapters[GOOD_ADAPTER]
    bad = overflowing_copy(good, "bad", value)
    device = engine.runner.device  # where the adapters live
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0)).to(device)
    segments = (LoraSegment(0, 2, good), LoraSegment(2, 3, bad))
    stacked = build_stacked_lora((good, bad))
    masks = stacked_masks(stacked, torch.tensor([0, 0, 1], device=device))
    for projection in ("qkv", "o"):
        expected = torch.zeros(2, {"qkv": 128, "o": 64}[projection], device=device)
        add_lora_delta(expected, x[:2], LoraBatch((SegmentedStep(segments[:1]),)), 0, projection)
        out = torch.zeros(3, expected.shape[1], device=device)
        add_lora_delta(out, x, LoraBatch((StackedStep(segments, stacked, masks),)), 0, projection)
        assert torch.isfinite(out[:2]).all()
        torch.testing.assert_close(out[:2], expected)
