"""The engine's CPU fast paths give the same results as the plain ones: fp32 prefill GEMMs of a bf16 model."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gpu_workers.layers.linear import WIDE_GEMM_MIN_ROWS, MergedLinear, can_pack_linear
from gpu_workers.sampling import SamplingParams

needs_bf16_packing = pytest.mark.skipif(
    not can_pack_linear(torch.bfloat16, torch.device("cpu")), reason="oneDNN bf16 packed linear unavailable here"
)


def _linear(wide: bool) -> MergedLinear:
    torch.manual_seed(0)
    linear = MergedLinear(64, {"a": 96, "b": 32}, True, torch.bfloat16, torch.device("cpu"))
    linear.weight.data.normal_()
    linear.bias.data.normal_()  # type: ignore[union-attr]
    linear.pack(torch.float32 if wide else None)
    return linear


@needs_bf16_packing
@pytest.mark.parametrize("num_rows", [1, WIDE_GEMM_MIN_ROWS - 1, WIDE_GEMM_MIN_ROWS, 300])
def test_wide_gemm_rounds_like_the_bf16_gemm(num_rows: int) -> None:
    """Prefill-sized rows go through fp32 upcasts, smaller ones through the packed bf16 weight; either way the
    output is the exact product rounded to bf16 (up to the GEMMs' accumulation order)."""
    wide, native = _linear(True), _linear(False)
    assert wide.wide_dtype == torch.float32 and wide.weight.numel() > 0  # dense copy kept for the wide path
    assert native.wide_dtype is None and native.weight.numel() == 0
    x = torch.randn(num_rows, 64).bfloat16()
    dense = wide.weight.double()
    exact = (x.double() @ dense.t() + wide.bias.double()).bfloat16()  # type: ignore[union-attr]
    with torch.inference_mode():
        out_wide, out_native = wide(x), native(x)
    assert out_wide.dtype == out_native.dtype == torch.bfloat16
    ulp = exact.double().abs() * 2**-7 + 1e-6
    assert ((out_wide.double() - exact.double()).abs() <= ulp).all()
    assert ((out_native.double() - exact.double()).abs() <= ulp).all()
    if num_rows < WIDE_GEMM_MIN_ROWS:
        assert torch.equal(out_wide, out_native)  # the same packed kernel


@needs_bf16_packing
def test_fp32_prefill_gemms_match_peft_and_can_be_turned_off(make_engine: Any, hf_oracle: Any) -> None:
    """A prompt longer than WIDE_GEMM_MIN_ROWS (the wide path) gives peft's greedy tokens within bf16 noise,
    with the fast path forced on and off."""
    prompt = [1] + [7 + (i * 37) % 500 for i in range(WIDE_GEMM_MIN_ROWS + 40)]
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    on = make_engine(dtype="bfloat16", packed_linears=True, fp32_prefill_gemms=True)
    off = make_engine(dtype="bfloat16", packed_linears=True, fp32_prefill_gemms=False)
    assert on.runner.wide_gemm_dtype == torch.float32
    assert off.runner.wide_gemm_dtype is None
    for adapter in (None, "adapter-02"):
        expected = hf_oracle.logits(prompt, adapter)
        for engine in (on, off):
            logits = _prefill_logits(engine, prompt, adapter)
            assert (logits - expected).abs().max() < 0.05 * expected.abs().max() + 0.05


def _prefill_logits(engine: Any, prompt: list[int], adapter: str | None) -> torch.Tensor:
    from gpu_workers.model_runner import BatchEntry
    from gpu_workers.sequence import Sequence

    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    seq = Sequence("wide", prompt, params, adapter, 1)
    seq.block_table = engine.block_manager.allocate(engine.block_manager.num_blocks_for_tokens(seq.num_tokens))
    try:
        _, logits = engine.runner.execute([BatchEntry(seq, seq.num_tokens)], True)
    finally:
        engine.block_manager.free(seq.block_table)
    return logits[0]
