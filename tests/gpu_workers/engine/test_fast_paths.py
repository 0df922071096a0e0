"""The engine's CPU fast paths give the same results as the plain ones: fp32 prefill GEMMs of a bf16 model."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch

from gpu_workers.engine.layers.linear import WIDE_GEMM_MIN_ROWS, MergedLinear, can_pack_linear
from gpu_workers.engine.llm_engine import LLMEngine
from scheduler.core.sampling import SamplingParams


@pytest.fixture(scope="module")
def make_cpu_engine(make_engine: Callable[..., LLMEngine]) -> Callable[..., LLMEngine]:
    """CPU engines: the C LoRA kernel, oneDNN packing and fp32 prefill GEMMs are CPU
    kernels (on a CUDA machine the engine's device would be the GPU)."""
    return functools.partial(make_engine, device="cpu")


@pytest.fixture(scope="module")
def cpu_fp32_engine(make_cpu_engine: Callable[..., LLMEngine]) -> LLMEngine:
    """A shared fp32 CPU engine (tests using it must leave it idle)."""
    return make_cpu_engine()


needs_bf16_packing = pytest.mark.skipif(
    not can_pack_linear(torch.bfloat16, torch.device("cpu")),
    reason="oneDNN bf16 packed linear unavailable here",
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
def test_fp32_prefill_gemms_match_peft_and_can_be_turned_off(make_cpu_engine: Any, hf_oracle: Any) -> None:
    """A prompt longer than WIDE_GEMM_MIN_ROWS (the wide path) gives peft's greedy tokens within bf16 noise,
    with the fast path forced on and off."""
    prompt = [1] + [7 + (i * 37) % 500 for i in range(WIDE_GEMM_MIN_ROWS + 40)]
    on = make_cpu_engine(dtype="bfloat16", packed_linears=True, fp32_prefill_gemms=True)
    off = make_cpu_engine(dtype="bfloat16", packed_linears=True, fp32_prefill_gemms=False)
    assert on.runner.wide_gemm_dtype == torch.float32
    assert off.runner.wide_gemm_dtype is None
    for adapter in (None, "adapter-02"):
        expected = hf_oracle.logits(prompt, adapter)
        for engine in (on, off):
            logits = _prefill_logits(engine, prompt, adapter)
            assert (logits - expected).abs().max() < 0.05 * expected.abs().max() + 0.05


@pytest.mark.parametrize("num_rows", [WIDE_GEMM_MIN_ROWS - 1, WIDE_GEMM_MIN_ROWS, 300])
def test_wide_lora_segments_round_once_to_the_exact_delta(num_rows: int) -> None:
    """A prefill-sized LoRA segment of a bf16 model with wide_dtype set is (x A) B + out computed in fp32 and
    rounded once into out (within one bf16 ulp of the exact sum); shorter segments keep the bf16 ops."""
    from gpu_workers.engine.layers.lora import LoraAdapter, LoraSegment, SegmentedStep, build_lora_projection

    torch.manual_seed(1)
    modules = {
        "q_proj": (torch.randn(8, 64), torch.randn(48, 8)),
        "v_proj": (torch.randn(4, 64), torch.randn(16, 4)),
    }
    slices = {"q_proj": (0, 48), "k_proj": (48, 64), "v_proj": (64, 80)}
    proj = build_lora_projection(modules, "qkv", slices, 0.5, torch.bfloat16, torch.device("cpu"))
    assert proj is not None
    adapter = LoraAdapter("a", 8, 0.5, ("q_proj", "v_proj"), ({"qkv": proj},), 0)
    x, base = torch.randn(num_rows, 64).bfloat16(), torch.randn(num_rows, 80).bfloat16()
    outs = {}
    for wide in (torch.float32, None):
        out = base.clone()
        SegmentedStep((LoraSegment(0, num_rows, adapter),), wide_dtype=wide).add_delta(out, x, 0, "qkv")
        outs[wide] = out
    exact = base.double().clone()
    xa = x.double() @ proj.a_t.double()
    for r0, r1, c0, c1, b_t in proj.parts:
        exact[:, c0:c1] += xa[:, r0:r1] @ b_t.double()
    if num_rows >= WIDE_GEMM_MIN_ROWS:
        ulp = exact.abs() * 2**-8 + 1e-6  # one rounding to bf16 (half an ulp) plus fp32 accumulation
        assert ((outs[torch.float32].double() - exact).abs() <= ulp).all()
        assert not torch.equal(outs[torch.float32], outs[None])  # the wide path ran (bf16 rounds x A first)
    else:
        assert torch.equal(outs[torch.float32], outs[None])


def _prefill_logits(engine: Any, prompt: list[int], adapter: str | None) -> torch.Tensor:
    from scheduler.core.sequence import BatchEntry, Sequence

    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    seq = Sequence("wide", prompt, params, adapter, 1)
    seq.block_table = engine.pool.allocate(engine.pool.num_blocks_for_tokens(seq.num_tokens))
    try:
        _, logits = engine.runner.execute([BatchEntry(seq, seq.num_tokens)], True)
    finally:
        engine.pool.free(seq.block_table)
    return logits[0].cpu()  # beside the oracle's, on the CPU


# ---------------------------------------------------------------------------------------------------------
# The LoRA CPU kernel (layers/lora_kernel.py)


def _kernel_or_skip() -> None:
    from gpu_workers.engine.layers.lora_kernel import is_kernel_usable

    if not is_kernel_usable(torch.device("cpu"), torch.float32):
        pytest.skip("the LoRA CPU kernel cannot be built here (no C compiler)")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens_per_segment", [[1, 1, 1], [3, 0, 9], [16, 2, 5]])
def test_kernel_delta_equals_the_segment_form(
    cpu_fp32_engine: Any, dtype: torch.dtype, tokens_per_segment: list[int]
) -> None:
    """For every projection and layer, one kernel call adds what the per-segment matmuls add (fp32: to
    rounding; bf16: within one rounding of the output), blocks of more than 8 tokens and empty segments
    included."""
    from gpu_workers.engine.layers.lora import (
        LoraBatch,
        LoraSegment,
        SegmentedStep,
        add_lora_delta,
        map_lora_tensors,
    )
    from gpu_workers.engine.layers.lora_descriptors import adapter_descriptors
    from gpu_workers.engine.layers.lora_kernel import KernelStep, build_kernel_lora

    _kernel_or_skip()
    names = ["adapter-02", "adapter-00", "adapter-03"]  # every module / q,v / gate,up,down
    adapters = tuple(
        map_lora_tensors(cpu_fp32_engine.runner.adapters[n], lambda t: t.to(dtype)) for n in names
    )
    bounds = [0]
    for n in tokens_per_segment:
        bounds.append(bounds[-1] + n)
    segments = tuple(LoraSegment(bounds[i], bounds[i + 1], a) for i, a in enumerate(adapters))
    kernel = build_kernel_lora(adapters, [adapter_descriptors(a) for a in adapters])  # type: ignore[misc]
    step = KernelStep.of(kernel, segments)
    generator = torch.Generator().manual_seed(1)
    sizes = {"qkv": (64, 128), "o": (64, 64), "gate_up": (64, 352), "down": (176, 64)}
    for layer_idx in range(len(adapters[0].layers)):
        for projection, (in_features, out_features) in sizes.items():
            x = torch.randn(bounds[-1], in_features, generator=generator).to(dtype)
            base = torch.randn(bounds[-1], out_features, generator=generator).to(dtype)
            expected, out = base.clone(), base.clone()
            segmented = LoraBatch((SegmentedStep(tuple(s for s in segments if s.end > s.start)),))
            add_lora_delta(expected, x, segmented, layer_idx, projection)
            add_lora_delta(out, x, LoraBatch((step,)), layer_idx, projection)
            if dtype == torch.float32:
                torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
            else:
                tolerance = expected.float().abs() * 2**-7 + 1e-3  # one bf16 rounding of the output
                assert ((out.float() - expected.float()).abs() <= tolerance).all(), (layer_idx, projection)


def test_kernel_rows_of_a_normal_adapter_ignore_an_overflowing_neighbour(cpu_fp32_engine: Any) -> None:
    from gpu_workers.engine.layers.lora import LoraBatch, LoraSegment, SegmentedStep, add_lora_delta
    from gpu_workers.engine.layers.lora_descriptors import adapter_descriptors
    from gpu_workers.engine.layers.lora_kernel import KernelStep, build_kernel_lora
    from tests.gpu_workers.engine.test_row_isolation import overflowing_copy

    _kernel_or_skip()
    good = cpu_fp32_engine.runner.adapters["adapter-02"]
    for value in (3e38, float("inf"), float("nan")):
        bad = overflowing_copy(good, "bad", value)
        segments = (LoraSegment(0, 2, good), LoraSegment(2, 3, bad))
        kernel = build_kernel_lora((good, bad), [adapter_descriptors(good), adapter_descriptors(bad)])  # type: ignore[list-item]
        x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
        expected = torch.zeros(2, 128)
        add_lora_delta(expected, x[:2], LoraBatch((SegmentedStep(segments[:1]),)), 0, "qkv")
        out = torch.zeros(3, 128)
        add_lora_delta(out, x, LoraBatch((KernelStep.of(kernel, segments),)), 0, "qkv")
        assert torch.isfinite(out[:2]).all()
        torch.testing.assert_close(out[:2], expected)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kernel_decode_matches_peft_and_the_torch_forms(
    make_cpu_engine: Any, hf_oracle: Any, prompt_ids: list[list[int]], adapter_dirs: dict, dtype: str
) -> None:
    """A mixed batch decoded through the kernel gives the tokens of the per-segment torch form; in fp32 both
    equal peft's."""
    _kernel_or_skip()
    adapters: list[str | None] = [*adapter_dirs, None, *adapter_dirs]
    prompts = [prompt_ids[i % len(prompt_ids)] for i in range(len(adapters))]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    kernel = make_cpu_engine(dtype=dtype, decode_lora_form="kernel")
    assert kernel.runner.lora_forms.use_lora_kernel
    outs = kernel.generate(prompts, params, adapter_ids=adapters)
    assert kernel.runner.lora_forms.kernel_sets and kernel.runner_stats().num_lora_stack_builds == 0
    looped = make_cpu_engine(dtype=dtype, lora_kernel=False, lora_stack_cache_size=0)
    outs_loop = looped.generate(prompts, params, adapter_ids=adapters)
    for prompt, adapter, out, out_loop in zip(prompts, adapters, outs, outs_loop):
        if dtype == "float32":
            assert out.token_ids == out_loop.token_ids == hf_oracle.greedy(prompt, adapter, 8), adapter
        else:
            assert out.token_ids[:4] == out_loop.token_ids[:4], adapter  # bf16: rounding may flip later ties


def test_kernel_sets_drop_unloaded_adapters(make_cpu_engine: Any, prompt_ids: list[list[int]]) -> None:
    _kernel_or_skip()
    engine = make_cpu_engine(decode_lora_form="kernel")  # forced: the tuner may measure another form faster
    names = engine.loaded_adapters()[:3]
    engine.generate([prompt_ids[0]] * 3, SamplingParams(max_tokens=3, temperature=0), adapter_ids=names)
    assert engine.runner.lora_forms.kernel_sets
    engine.unload_adapter(names[0])
    assert not any(
        a.adapter_id == names[0] for s in engine.runner.lora_forms.kernel_sets.values() for a in s.adapters
    )


def test_host_malloc_tuning_applies_once_on_glibc() -> None:
    import platform

    from gpu_workers.engine.host_malloc import keep_large_allocations_on_heap

    first = keep_large_allocations_on_heap()
    assert keep_large_allocations_on_heap() is first
    if platform.libc_ver()[0] == "glibc":
        assert first
