"""Grouped LoRA deltas on CUDA with Triton (Punica's SGMV and BGMV): per projection of a layer, one shrink
launch (x @ A^T into rank space) and one expand launch (out += h @ B^T) whatever the number of distinct
adapters; the kernel bodies are in layers/triton_lora_kernels.py.

Mixed ranks in one launch: the grid is sized by the launch's largest rank (`LaunchBounds`), and each program
reads its adapter's own rank from the adapter's descriptor row (layers/lora_descriptors.py): a shrink program
whose rank block lies past its adapter's rank columns exits at once, and an expand program loops over exactly its
adapter's rank. Weights are read where the engine keeps them (each adapter its own tensors, views into the KV
pages in the unified pool): no stacked copy per adapter set and no padding to the largest rank, so an adapter
costs its own bytes and its own flops (to a block of BLOCK_R rank columns). Only the transient fp32
intermediate h: [num_rows, largest rank_cols] is padded (a decode step: KiBs; 8192 prefill rows at rank 256 on
q/k/v: 24 MiB).

Forms (kernel_plan's decode_lora, on CUDA): "sgmv" runs every segment through SGMV (BLOCK_M rows of a segment
per program, tl.dot tiles); "bgmv" runs the rows of decode-sized segments (at most MAX_BGMV_SEGMENT_ROWS rows)
through BGMV (one row per program, a GEMV, rows indexed by a per-row adapter position, -1: none) and the longer
ones (prefill) through SGMV. Inputs bf16/fp16/fp32, fp32 accumulation, h rounded to the model dtype before the
expand (as the torch forms' x @ A) and each output element rounded once. The adapter's scale (alpha/r, rsLoRA
alpha/sqrt(r)) is folded into B^T at load (layers/lora.build_lora_projection), so the engine's forms pass no
`scales`; the kernels also take a per-adapter scale, fused into the expand, for unscaled B.

On CPU tensors the kernels run under Triton's interpreter (the parity tests); the engine never picks these forms
there (`triton_unusable_reason`). triton is imported only when a kernel first runs. For captured decode steps:
BGMV's grid depends only on the number of rows and the set's bounds, and the adapter of each row is an input
tensor (`row_adapter`); SGMV's grid depends on the step's longest segment.
"""

from __future__ import annotations

import bisect
import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from gpu_workers.engine.layers.lora import LoraAdapter, LoraSegment
from gpu_workers.engine.layers.lora_descriptors import MAX_PARTS, PROJECTION_INDEX

if TYPE_CHECKING:
    from types import ModuleType

TRITON_LORA_FORMS = ("sgmv", "bgmv")
MAX_BGMV_SEGMENT_ROWS = 16  # "bgmv": segments of at most this many rows (decode) go one row per program
TRITON_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def triton_unusable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the Triton forms cannot serve this device and dtype, or None when they can."""
    if device.type != "cuda":
        return f"Triton kernels run on CUDA (this device: {device.type}; Triton's CPU interpreter is a test tool)"
    if dtype not in TRITON_DTYPES:
        return f"the Triton kernels serve bfloat16, float16 and float32, not {dtype}"
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    try:
        import triton  # noqa: F401 (importable: the kernels compile on first use)
    except ImportError as exc:
        return f"triton cannot be imported ({exc})"
    kernels = sys.modules.get("gpu_workers.engine.layers.triton_lora_kernels")
    is_interpret_set = os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on", "yes")
    if is_interpret_set or getattr(kernels, "IS_INTERPRETED", False):
        return "TRITON_INTERPRET=1 was set: Triton's interpreter (a test tool) cannot read device memory"
    return None


@dataclass(frozen=True)
class LaunchBounds:
    """The largest shapes among a launch's adapters on one (layer, projection), which size its grids."""

    max_rank_cols: int
    max_part_cols: int
    max_parts: int


@dataclass(frozen=True)
class LaunchConfig:
    """Block sizes: rows per SGMV program, in_features per step, rank columns per shrink program and per expand
    step, output columns per expand program (each >= 16: tl.dot's smallest tile)."""

    block_m: int = 16
    block_k: int = 64
    block_r: int = 16
    block_n: int = 64


DEFAULT_LAUNCH = LaunchConfig()


@dataclass(frozen=True)
class TritonLora:
    """Descriptors of an ordered set of adapters on the device (holds the adapters, so their tensors stay alive).

    desc: [num_adapters, num_layers, len(PROJECTIONS), DESC_STRIDE] int64; bounds[layer][projection] (absent:
    no adapter of the set targets it).
    """

    adapters: tuple[LoraAdapter, ...]
    desc: torch.Tensor
    bounds: tuple[dict[str, LaunchBounds], ...]

    def projection_desc(self, layer_idx: int, projection: str) -> torch.Tensor:
        """[num_adapters, DESC_STRIDE] view: every adapter's descriptor row of one (layer, projection)."""
        return self.desc[:, layer_idx, PROJECTION_INDEX[projection]]


def build_triton_lora(
    adapters: tuple[LoraAdapter, ...], descriptors: list[torch.Tensor], device: torch.device
) -> TritonLora:
    """TritonLora of `adapters` from their `adapter_descriptors` (CPU), copied to `device`."""
    desc = torch.stack(descriptors)  # [num_adapters, num_layers, len(PROJECTIONS), DESC_STRIDE]
    return TritonLora(adapters, desc.to(device), launch_bounds(desc))


def launch_bounds(desc: torch.Tensor) -> tuple[dict[str, LaunchBounds], ...]:
    """Per layer and projection, the largest rank columns, part width and number of parts of the adapters'
    descriptors desc: [num_adapters, num_layers, len(PROJECTIONS), DESC_STRIDE] (CPU)."""
    parts = desc[..., 4:].reshape(*desc.shape[:3], MAX_PARTS, 6)
    rank_cols = desc[..., 2].amax(0)  # [num_layers, len(PROJECTIONS)]
    num_parts = desc[..., 3].amax(0)
    part_cols = (parts[..., 3] - parts[..., 2]).amax(dim=(0, 3))
    return tuple(
        {
            name: LaunchBounds(int(rank_cols[layer, p]), int(part_cols[layer, p]), int(num_parts[layer, p]))
            for name, p in PROJECTION_INDEX.items()
            if rank_cols[layer, p] > 0
        }
        for layer in range(desc.shape[1])
    )


def shrink_buffer(num_rows: int, bounds: LaunchBounds, device: torch.device) -> torch.Tensor:
    """The shrink's output h: [num_rows, max_rank_cols] fp32 (only each row's own adapter's columns are written
    and read)."""
    return torch.empty(num_rows, bounds.max_rank_cols, dtype=torch.float32, device=device)


def _kernels(x: torch.Tensor) -> ModuleType:
    """The kernels module (imported on first use); CPU tensors need its interpreted kernels."""
    from gpu_workers.engine.layers import triton_lora_kernels

    if x.device.type == "cpu" and not triton_lora_kernels.IS_INTERPRETED:
        raise RuntimeError(
            "the Triton LoRA kernels run on CPU tensors only under Triton's interpreter: set TRITON_INTERPRET=1 "
            "before triton is first imported"
        )
    return triton_lora_kernels


def _dot_options(x: torch.Tensor) -> dict[str, object]:
    """The interpreter gets fp32 tiles (it has no bf16 arithmetic); fp32 products stay fp32 (no TF32)."""
    is_interpreted = x.device.type == "cpu"
    is_fp32 = is_interpreted or x.dtype == torch.float32
    return {"UPCAST": is_interpreted, "PRECISION": "ieee" if is_fp32 else "tf32"}


def sgmv_shrink(
    h: torch.Tensor,
    x: torch.Tensor,
    desc: torch.Tensor,
    seg_table: torch.Tensor,
    max_segment_rows: int,
    bounds: LaunchBounds,
    config: LaunchConfig = DEFAULT_LAUNCH,
) -> None:
    """h[seg rows, :rank_cols] = x[seg rows] @ A^T of each segment's adapter, one launch.

    h: [num_rows, >= max_rank_cols] fp32; x: [num_rows, in_features] (rows contiguous); desc: [num_adapters,
    DESC_STRIDE] int64; seg_table: [num_segments, 3] int32 (start, end, adapter position; -1: none).
    """
    if seg_table.shape[0] == 0 or max_segment_rows == 0:
        return
    grid = (
        seg_table.shape[0],
        _cdiv(max_segment_rows, config.block_m),
        _cdiv(bounds.max_rank_cols, config.block_r),
    )
    _kernels(x).sgmv_shrink[grid](
        x, x.stride(0), h, h.stride(0), seg_table, desc, desc.stride(0), x.shape[1],
        BLOCK_M=config.block_m, BLOCK_K=config.block_k, BLOCK_R=config.block_r, **_dot_options(x),
    )  # fmt: skip


def sgmv_expand(
    out: torch.Tensor,
    h: torch.Tensor,
    desc: torch.Tensor,
    seg_table: torch.Tensor,
    max_segment_rows: int,
    bounds: LaunchBounds,
    scales: torch.Tensor | None = None,
    config: LaunchConfig = DEFAULT_LAUNCH,
) -> None:
    """out[seg rows, c0:c1] += scale * h[seg rows, r0:r1] @ B^T for every part of each segment's adapter, one
    launch. out: [num_rows, out_features] (rows contiguous, updated in place); scales: [num_adapters] fp32 or
    None (scale folded into B^T)."""
    if seg_table.shape[0] == 0 or max_segment_rows == 0:
        return
    num_col_blocks = _cdiv(bounds.max_part_cols, config.block_n)
    grid = (
        seg_table.shape[0],
        _cdiv(max_segment_rows, config.block_m),
        bounds.max_parts * num_col_blocks,
    )
    _kernels(out).sgmv_expand[grid](
        h, h.stride(0), out, out.stride(0), seg_table, desc, desc.stride(0),
        scales if scales is not None else h, num_col_blocks, HAS_SCALE=scales is not None,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_R=config.block_r, **_dot_options(out),
    )  # fmt: skip


def bgmv_shrink(
    h: torch.Tensor,
    x: torch.Tensor,
    desc: torch.Tensor,
    row_adapter: torch.Tensor,
    bounds: LaunchBounds,
    config: LaunchConfig = DEFAULT_LAUNCH,
) -> None:
    """h[row, :rank_cols] = x[row] @ A^T of the row's adapter for rows [0, len(row_adapter)), one launch.

    row_adapter: [num_rows] int32 adapter position per row (-1: no adapter, h row untouched).
    """
    if row_adapter.shape[0] == 0:
        return
    grid = (row_adapter.shape[0], _cdiv(bounds.max_rank_cols, config.block_r))
    _kernels(x).bgmv_shrink[grid](
        x, x.stride(0), h, h.stride(0), row_adapter, desc, desc.stride(0), x.shape[1],
        BLOCK_K=config.block_k, BLOCK_R=config.block_r,
    )  # fmt: skip


def bgmv_expand(
    out: torch.Tensor,
    h: torch.Tensor,
    desc: torch.Tensor,
    row_adapter: torch.Tensor,
    bounds: LaunchBounds,
    scales: torch.Tensor | None = None,
    config: LaunchConfig = DEFAULT_LAUNCH,
) -> None:
    """out[row, c0:c1] += scale * h[row, r0:r1] @ B^T for every part of the row's adapter (rows with -1 get
    nothing), one launch."""
    if row_adapter.shape[0] == 0:
        return
    num_col_blocks = _cdiv(bounds.max_part_cols, config.block_n)
    grid = (row_adapter.shape[0], bounds.max_parts * num_col_blocks)
    _kernels(out).bgmv_expand[grid](
        h, h.stride(0), out, out.stride(0), row_adapter, desc, desc.stride(0),
        scales if scales is not None else h, num_col_blocks, HAS_SCALE=scales is not None,
        BLOCK_N=config.block_n, BLOCK_R=config.block_r,
    )  # fmt: skip


def _cdiv(n: int, block: int) -> int:
    """ceil(n / block) (triton.cdiv without importing triton)."""
    return -(-n // block)


Span = tuple[int, int, int]  # (start row, end row, adapter position)


@dataclass(frozen=True)
class TritonStep:
    """One step's rows served by the Triton kernels: `sgmv` spans through SGMV, `bgmv` spans through BGMV (rows
    of no span get nothing); seg_table / row_adapter are the same on the device."""

    lora: TritonLora
    sgmv: tuple[Span, ...]
    bgmv: tuple[Span, ...]
    seg_table: torch.Tensor  # [len(sgmv), 3] int32
    max_sgmv_rows: int
    row_adapter: torch.Tensor  # [last bgmv row + 1] int32, -1 on rows of no bgmv span
    config: LaunchConfig = DEFAULT_LAUNCH

    @classmethod
    def of(
        cls,
        lora: TritonLora,
        segments: tuple[LoraSegment, ...],
        max_bgmv_rows: int = 0,
        config: LaunchConfig = DEFAULT_LAUNCH,
    ) -> TritonStep | None:
        """The step over `segments` (their adapters in `lora.adapters`); segments of at most `max_bgmv_rows`
        rows go through BGMV (0: every segment through SGMV). None when no segment has a row."""
        position = {id(adapter): pos for pos, adapter in enumerate(lora.adapters)}
        spans = [(seg.start, seg.end, position[id(seg.adapter)]) for seg in segments if seg.end > seg.start]
        return cls.from_spans(
            lora,
            tuple(s for s in spans if s[1] - s[0] > max_bgmv_rows),
            tuple(s for s in spans if s[1] - s[0] <= max_bgmv_rows),
            config,
        )

    @classmethod
    def from_spans(
        cls,
        lora: TritonLora,
        sgmv: tuple[Span, ...],
        bgmv: tuple[Span, ...],
        config: LaunchConfig = DEFAULT_LAUNCH,
    ) -> TritonStep | None:
        """The step over these spans, their device tables built here; None when both are empty."""
        if not sgmv and not bgmv:
            return None
        device = lora.desc.device
        seg_table = torch.tensor(sgmv, dtype=torch.int32).reshape(-1, 3).to(device)
        row_adapter = torch.full((max((end for _, end, _ in bgmv), default=0),), -1, dtype=torch.int32)
        for start, end, pos in bgmv:
            row_adapter[start:end] = pos
        max_sgmv_rows = max((end - start for start, end, _ in sgmv), default=0)
        return cls(lora, sgmv, bgmv, seg_table, max_sgmv_rows, row_adapter.to(device), config)

    def add_delta(self, out: torch.Tensor, x: torch.Tensor, layer_idx: int, projection: str) -> None:
        """out[rows] += x[rows] @ A @ B of each row's adapter, one shrink and one expand per kernel family.

        out: [num_tokens, out_features] (rows contiguous, updated in place); x: [num_tokens, in_features].
        """
        bounds = self.lora.bounds[layer_idx].get(projection)
        if bounds is None:
            return
        assert out.stride(1) == 1
        x = x if x.stride(1) == 1 else x.contiguous()
        desc = self.lora.projection_desc(layer_idx, projection)
        h = shrink_buffer(x.shape[0], bounds, x.device)
        if self.sgmv:
            sgmv_shrink(h, x, desc, self.seg_table, self.max_sgmv_rows, bounds, self.config)
            sgmv_expand(out, h, desc, self.seg_table, self.max_sgmv_rows, bounds, None, self.config)
        if self.bgmv:
            bgmv_shrink(h, x, desc, self.row_adapter, bounds, self.config)
            bgmv_expand(out, h, desc, self.row_adapter, bounds, None, self.config)

    def select_rows(self, row_list: list[int]) -> TritonStep | None:
        """The same adapters over batch rows `row_list` (ascending), renumbered (row i = row_list[i])."""

        def renumber(spans: tuple[Span, ...]) -> tuple[Span, ...]:
            moved = (
                (bisect.bisect_left(row_list, s), bisect.bisect_left(row_list, e), p) for s, e, p in spans
            )
            return tuple(span for span in moved if span[1] > span[0])

        return TritonStep.from_spans(self.lora, renumber(self.sgmv), renumber(self.bgmv), self.config)

    def begin_layer(self, layer_idx: int) -> None:
        """Nothing changes between layers."""
