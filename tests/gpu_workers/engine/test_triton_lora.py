"""The grouped Triton LoRA kernels (layers/triton_lora.py) add exactly each row's own adapter's delta: SGMV over
prefill segments and BGMV over decode rows, shrink then expand, ranks 8..128 mixed in one launch, every merged
projection (q/k/v, o, gate/up, down: all seven modules), fp32/bf16/fp16 inputs with fp32 accumulation, the scale
fused (alpha/r, rsLoRA); rows of no adapter get nothing. Checked against an fp64 reference and the segmented
torch form, under Triton's interpreter on CPU in CI (tests/gpu_workers/engine/triton_interpreter.py)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_workers.engine.layers.lora import (
    LoraAdapter,
    LoraSegment,
    SegmentedStep,
    build_lora_projection,
)
from gpu_workers.engine.layers.lora_descriptors import adapter_descriptors
from gpu_workers.engine.layers.lora_forms import projection_slices
from gpu_workers.engine.layers.triton_lora import (
    LaunchConfig,
    TritonLora,
    TritonStep,
    bgmv_expand,
    bgmv_shrink,
    build_triton_lora,
    launch_bounds,
    sgmv_expand,
    sgmv_shrink,
    shrink_buffer,
)
from tests.gpu_workers.engine.triton_interpreter import KERNEL_DEVICE, needs_triton_kernels

pytestmark = needs_triton_kernels
DEVICE = KERNEL_DEVICE or torch.device("cpu")
# hidden 48, 4 query heads and 2 KV heads of 16 (q 64 columns, k/v 32: GQA), intermediate 80
SLICES = projection_slices(48, 80, 4, 2, 16)
ALL_MODULES = tuple(m for _, outs in SLICES.values() for m in outs)
# bf16 keeps 8 bits, fp16 11: the kernels round x @ A and the output once each, as the torch forms do
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}
Raw = dict[str, tuple[torch.Tensor, torch.Tensor]]  # module -> (lora_A [r, in], lora_B [out, r]) in fp32


def _raw_adapter(rank: int, modules: tuple[str, ...], seed: int) -> Raw:
    generator = torch.Generator().manual_seed(seed)
    raw = {}
    for in_features, outs in SLICES.values():
        for module, (c0, c1) in outs.items():
            if module in modules:
                a = torch.randn(rank, in_features, generator=generator) / in_features**0.5
                raw[module] = (a, torch.randn(c1 - c0, rank, generator=generator) / rank**0.5)
    return raw


def _adapter(raw: Raw, rank: int, scale: float, dtype: torch.dtype, name: str) -> LoraAdapter:
    """The engine's packing of `raw` with `scale` folded into B^T (scale 1: B as is)."""
    layer = {}
    for projection, (_, outs) in SLICES.items():
        modules = {m: w for m, w in raw.items() if m in outs}
        proj = build_lora_projection(modules, projection, outs, scale, dtype, DEVICE) if modules else None
        if proj is not None:
            layer[projection] = proj
    return LoraAdapter(name, rank, scale, tuple(raw), (layer,), 0)


# (rank, targeted modules, scale): ranks 8..128 in one launch, one adapter on a subset (q, v, down only)
ADAPTERS = (
    (8, ALL_MODULES, 16 / 8),  # alpha / r
    (16, ("q_proj", "v_proj", "down_proj"), 32 / 16),
    (64, ALL_MODULES, 16 / math.sqrt(64)),  # rsLoRA: alpha / sqrt(r)
    (128, ALL_MODULES, 8 / 128),
)
RAW = [_raw_adapter(rank, modules, seed) for seed, (rank, modules, _) in enumerate(ADAPTERS)]
# (start, end, adapter position): prefill-like spans of 1..37 rows, an empty span, gaps (rows 3, 41..43, 60..)
# of no adapter, an adapter used twice, and a span of adapter -1 (base model); decode-like spans of 1..2 rows
SPANS = ((0, 3, 0), (4, 41, 1), (44, 44, 2), (44, 45, 2), (45, 52, 3), (52, 54, 0), (54, 60, -1))
DECODE_SPANS = ((0, 1, 2), (1, 2, 0), (2, 4, 3), (4, 5, -1), (6, 7, 1), (7, 7, 0), (7, 8, 0))
NUM_ROWS = 64
# Triton's interpreter pays per program: most cases run larger blocks than the GPU default (which runs in the
# fp32 and the property cases)
WIDE = LaunchConfig(block_m=32, block_k=64, block_r=64, block_n=64)


def _lora_set(dtype: torch.dtype, fold_scale: bool) -> TritonLora:
    adapters = tuple(
        _adapter(raw, rank, scale if fold_scale else 1.0, dtype, f"a{pos}")
        for pos, (raw, (rank, _, scale)) in enumerate(zip(RAW, ADAPTERS))
    )
    descriptors = [adapter_descriptors(a) for a in adapters]
    assert all(d is not None for d in descriptors)
    return build_triton_lora(adapters, [d for d in descriptors if d is not None], DEVICE)


def _reference(x: torch.Tensor, out: torch.Tensor, projection: str, spans: tuple) -> torch.Tensor:
    """out + scale * x A^T B^T per row of each span, in fp64 from the fp32 weights."""
    expected = out.double()
    outs = SLICES[projection][1]
    for start, end, pos in spans:
        if pos < 0:
            continue
        *_, scale = ADAPTERS[pos]
        for module, (c0, c1) in outs.items():
            if module in RAW[pos]:
                a, b = RAW[pos][module]
                expected[start:end, c0:c1] += (
                    scale * (x[start:end].double() @ a.double().t()) @ b.double().t()
                )
    return expected


def _inputs(projection: str, dtype: torch.dtype, seed: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    in_features, outs = SLICES[projection]
    num_cols = max(c1 for _, c1 in outs.values())
    x = torch.randn(NUM_ROWS, in_features, generator=generator).to(dtype)
    out = torch.randn(NUM_ROWS, num_cols, generator=generator).to(dtype)
    return x.to(DEVICE), out.to(DEVICE)


def _assert_close(got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    err = (got.double().cpu() - expected.cpu()).abs().max().item()
    assert err <= TOLERANCE[dtype] * (1 + expected.abs().max().item()), err


def _untouched_rows(spans: tuple) -> list[int]:
    covered = {row for start, end, pos in spans if pos >= 0 for row in range(start, end)}
    return [row for row in range(NUM_ROWS) if row not in covered]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("is_bgmv", [False, True], ids=["sgmv", "bgmv"])
def test_each_row_gets_its_own_adapters_delta_on_every_projection(dtype: torch.dtype, is_bgmv: bool) -> None:
    """One SGMV shrink and expand per projection over prefill spans (or BGMV over decode rows), ranks 8/16/64/128
    mixed, give the fp64 reference and the segmented torch form's result; rows of no adapter (gaps, the base
    span) are left bit for bit."""
    spans = DECODE_SPANS if is_bgmv else SPANS
    lora = _lora_set(dtype, fold_scale=True)
    segments = tuple(LoraSegment(s, e, lora.adapters[p]) for s, e, p in spans if p >= 0)
    config = LaunchConfig() if dtype == torch.float32 else WIDE
    step = TritonStep.of(lora, segments, NUM_ROWS if is_bgmv else 0, config)
    assert step is not None and bool(step.bgmv) == is_bgmv and bool(step.sgmv) != is_bgmv
    for projection in SLICES:
        x, out = _inputs(projection, dtype)
        got, torch_form = out.clone(), out.clone()
        step.add_delta(got, x, 0, projection)
        SegmentedStep(segments).add_delta(torch_form, x, 0, projection)
        _assert_close(got, _reference(x.cpu(), out.cpu(), projection, spans), dtype)
        _assert_close(got, torch_form.double(), dtype)
        rows = _untouched_rows(spans)
        assert torch.equal(got[rows], out[rows]), projection


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shrink_then_expand_with_the_scale_fused(dtype: torch.dtype) -> None:
    """Weights with B unscaled and the per-adapter scale (alpha/r, rsLoRA alpha/sqrt(r)) given to the expand: the
    shrink writes x @ A^T into each row's own rank columns, the expand adds scale * h @ B^T; SGMV and BGMV (and
    a span of adapter -1 in both) agree with the reference."""
    lora = _lora_set(dtype, fold_scale=False)
    scales = torch.tensor([scale for *_, scale in ADAPTERS], dtype=torch.float32, device=DEVICE)
    seg_table = torch.tensor(SPANS, dtype=torch.int32, device=DEVICE)
    row_adapter = torch.full((8,), -1, dtype=torch.int32)
    for start, end, pos in DECODE_SPANS:
        row_adapter[start:end] = pos
    row_adapter = row_adapter.to(DEVICE)
    for projection in ("qkv", "down"):
        x, out = _inputs(projection, dtype)
        desc, bounds = lora.projection_desc(0, projection), lora.bounds[0][projection]
        for spans in (SPANS, DECODE_SPANS):
            h, got = shrink_buffer(NUM_ROWS, bounds, DEVICE), out.clone()
            if spans is DECODE_SPANS:
                bgmv_shrink(h, x, desc, row_adapter, bounds, WIDE)
                bgmv_expand(got, h, desc, row_adapter, bounds, scales, WIDE)
            else:
                sgmv_shrink(h, x, desc, seg_table, 37, bounds, WIDE)
                sgmv_expand(got, h, desc, seg_table, 37, bounds, scales, WIDE)
            for start, end, pos in spans:
                if pos >= 0 and end > start:
                    a_t = lora.adapters[pos].layers[0][projection].a_t
                    xa = x[start:end].double() @ a_t.double()
                    _assert_close(h[start:end, : a_t.shape[1]], xa.cpu(), dtype)
            _assert_close(got, _reference(x.cpu(), out.cpu(), projection, spans), dtype)


def test_launch_bounds_are_the_largest_shapes_among_the_adapters() -> None:
    """The grid of a projection is sized by the set's largest rank columns, part and number of parts; a
    projection no adapter targets has no launch."""
    lora = _lora_set(torch.float32, fold_scale=True)
    bounds = launch_bounds(lora.desc.cpu())[0]
    assert bounds["qkv"].max_rank_cols == 3 * 128 and bounds["qkv"].max_parts == 3
    assert bounds["qkv"].max_part_cols == 64  # q (4 heads x 16) is wider than k and v (2 heads)
    assert bounds["gate_up"].max_rank_cols == 2 * 128 and bounds["down"].max_parts == 1
    only_v = _adapter(_raw_adapter(8, ("v_proj",), 9), 8, 1.0, torch.float32, "v")
    descriptors = adapter_descriptors(only_v)
    assert descriptors is not None
    assert set(launch_bounds(descriptors.unsqueeze(0))[0]) == {"qkv"}


def test_selected_rows_keep_their_adapters() -> None:
    """select_rows (the last layer keeps only sampled rows) renumbers the spans: the selected rows of a full
    step's result, on both kernel families."""
    lora = _lora_set(torch.float32, fold_scale=True)
    segments = tuple(LoraSegment(s, e, lora.adapters[p]) for s, e, p in SPANS if p >= 0)
    rows = [0, 2, 3, 5, 40, 44, 51, 53, 63]
    for max_bgmv_rows in (0, 4):
        step = TritonStep.of(lora, segments, max_bgmv_rows, WIDE)
        assert step is not None
        selected = step.select_rows(rows)
        assert selected is not None
        x, out = _inputs("gate_up", torch.float32)
        full, part = out.clone(), out[rows].clone()
        step.add_delta(full, x, 0, "gate_up")
        selected.add_delta(part, x[rows], 0, "gate_up")
        assert torch.allclose(part, full[rows], atol=1e-6)
        assert step.select_rows([3, 41, 42]) is None  # rows of no adapter


@settings(max_examples=8, deadline=None, derandomize=True)
@given(
    lengths=st.lists(st.integers(0, 37), min_size=1, max_size=5),
    positions=st.lists(st.integers(-1, len(ADAPTERS) - 1), min_size=5, max_size=5),
    max_bgmv_rows=st.sampled_from([0, 2]),
)
def test_any_segment_layout_matches_the_reference(
    lengths: list[int], positions: list[int], max_bgmv_rows: int
) -> None:
    """Random segment layouts (empty segments, rows of no adapter, any mix of SGMV and BGMV rows) on the fused
    q/k/v projection (three parts, a partly targeting adapter) match the reference."""
    spans, row = [], 0
    for length, pos in zip(lengths, positions):
        spans.append((row, min(row + length, NUM_ROWS), pos))
        row = min(row + length, NUM_ROWS)
    lora = _lora_set(torch.float32, fold_scale=True)
    segments = tuple(LoraSegment(s, e, lora.adapters[p]) for s, e, p in spans if p >= 0)
    x, out = _inputs("qkv", torch.float32)
    step = TritonStep.of(lora, segments, max_bgmv_rows)
    got = out.clone()
    if step is not None:
        step.add_delta(got, x, 0, "qkv")
    _assert_close(got, _reference(x.cpu(), out.cpu(), "qkv", tuple(spans)), torch.float32)
