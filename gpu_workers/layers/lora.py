"""Multi-LoRA: per-adapter weights and the segmented (SGMV-style) delta over a batch.

Tokens of a batch are sorted so each adapter's tokens are contiguous (a segment). For every merged
projection (qkv, o, gate_up, down) and every segment there is one x_seg @ A_cat and one addmm per target
sub-module into its output column slice. No per-token weight gather, no padding to a max rank: each
adapter costs its own rank. The LoRA scale is folded into B at load time.

Decode-sized steps (many segments of a token or two) would pay hundreds of tiny matmuls per step, each
dominated by per-call overhead. For those the runner uses a stacked form instead: per layer and projection,
the batch's adapters' A (columns) and B (rows) concatenated once per adapter set (cached, see
`StackedLora`), so a projection costs one x @ A_cat, one masked fill by a [num_tokens, sum_ranks] bool mask
(each token keeps only its own adapter's columns; built once per step, shared by all layers) and one addmm
per target sub-module. Its cost is proportional to the sum of the batch's ranks, still with no padding.

Isolation in the stacked form: x @ A_cat computes every token against every adapter, so a token's columns of
another adapter may hold inf/NaN when that adapter overflows. They are *set* to exactly 0 (masked_fill, never
a multiply: inf * 0 = NaN), and the stacked B rows are made finite at build time (0 * inf = NaN too), so a
token's delta depends only on its own adapter's weights.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from gpu_workers.layers.linear import WIDE_GEMM_MIN_ROWS, pack_linear_weight, packed_linear

if TYPE_CHECKING:
    from gpu_workers.layers.host_lora import HostLora
    from gpu_workers.layers.lora_kernel import KernelStep

# Merged projections of a decoder layer and the HF modules stacked in each (in output-column order).
PROJECTIONS: dict[str, tuple[str, ...]] = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}
MODULE_TO_PROJECTION = {m: p for p, mods in PROJECTIONS.items() for m in mods}


@dataclass(frozen=True)
class LoraProjection:
    """One adapter's delta on one merged projection of one layer.

    a_t: [in_features, sum of ranks of the targeted sub-modules] (A pre-transposed and concatenated).
    parts: (rank_start, rank_end, col_start, col_end, b_t) with b_t = scale * B^T: [rank, out_cols].
    """

    a_t: torch.Tensor
    parts: tuple[tuple[int, int, int, int, torch.Tensor], ...]


@dataclass(frozen=True)
class LoraAdapter:
    """A loaded adapter: layers[i][projection] -> LoraProjection (absent when not targeted)."""

    adapter_id: str
    rank: int
    scale: float
    target_modules: tuple[str, ...]
    layers: tuple[dict[str, LoraProjection], ...]
    num_bytes: int


@dataclass(frozen=True)
class LoraSegment:
    """Tokens [start, end) of the batch all use `adapter`."""

    start: int
    end: int
    adapter: LoraAdapter


@dataclass(frozen=True)
class StackedProjection:
    """The batch's adapters on one merged projection of one layer, concatenated along the rank dim.

    a_t: [in_features, S] (columns grouped by target sub-module, then by adapter in batch order).
    parts: (s_start, s_end, col_start, col_end, b_t) with b_t: [s_end - s_start, out_cols] (scale folded).
    layout: index of the column-owner layout (StackedLora.owners) that masks xa = x @ a_t.
    is_packed: a_t and every b_t are oneDNN-packed linear weights (of a_t^T and b_t^T) instead.
    """

    a_t: torch.Tensor
    parts: tuple[tuple[int, int, int, int, torch.Tensor], ...]
    layout: int
    is_packed: bool = False


@dataclass(frozen=True)
class StackedLora:
    """Stacked weights of an ordered set of adapters (one batch composition), for every layer.

    owners[layout]: [S] long, position (in `adapters`) of the adapter owning each stacked column.
    """

    adapters: tuple[LoraAdapter, ...]
    layers: tuple[dict[str, StackedProjection], ...]
    owners: tuple[torch.Tensor, ...]
    num_bytes: int


@dataclass(frozen=True)
class LoraBatch:
    """Per-step segment metadata, built once per step and reused by every layer.

    When `stacked` is set, the step uses the stacked form: masks[layout] is [num_tokens, S] bool, True where
    the column belongs to another adapter than the token's (dropped; tokens without adapter: all True).
    `host`: segments whose adapter is still being copied (CPU-assisted prefill, layers/host_lora.py); their
    tokens are in no device segment and the stacked form adds exactly 0 to them.
    `wide_dtype` (float32 for a bf16 model whose prefill GEMMs run wide, see layers/linear.MergedLinear):
    segments of at least WIDE_GEMM_MIN_ROWS tokens multiply exact upcasts and round once into `out`.
    """

    segments: tuple[LoraSegment, ...]
    stacked: StackedLora | None = None
    masks: tuple[torch.Tensor, ...] = ()
    host: HostLora | None = None
    kernel: KernelStep | None = None
    wide_dtype: torch.dtype | None = None

    @property
    def is_empty(self) -> bool:
        """True when no token uses an adapter."""
        return not self.segments and self.host is None and self.kernel is None


def add_lora_delta(
    out: torch.Tensor, x: torch.Tensor, lora: LoraBatch, layer_idx: int, projection: str
) -> None:
    """out[seg] += scale * (x[seg] @ A) @ B for every segment whose adapter targets `projection`.

    out: [num_tokens, out_features] (merged projection output, updated in place); x: [num_tokens, in].
    Host-assisted segments go last (their CPU workers write rows no device op touches any more).
    """
    _add_device_delta(out, x, lora, layer_idx, projection)
    if lora.host is not None:
        lora.host.add_delta(out, x, layer_idx, projection)


def _add_device_delta(out: torch.Tensor, x: torch.Tensor, lora: LoraBatch, layer_idx: int, projection: str) -> None:
    if lora.kernel is not None:  # short segments (layers/lora_kernel.py); `segments` holds the others
        lora.kernel.add_delta(out, x, layer_idx, projection)
    if lora.stacked is not None:
        stacked = lora.stacked.layers[layer_idx].get(projection)
        if stacked is None:
            return
        if stacked.is_packed:
            xa = packed_linear(x, stacked.a_t).masked_fill_(lora.masks[stacked.layout], 0.0)  # [num_tokens, S]
            for s0, s1, c0, c1, b_packed in stacked.parts:
                out[:, c0:c1] += packed_linear(xa[:, s0:s1], b_packed)
            return
        xa = torch.mm(x, stacked.a_t).masked_fill_(lora.masks[stacked.layout], 0.0)  # [num_tokens, S]
        if len(stacked.parts) == 1 and stacked.parts[0][3] - stacked.parts[0][2] == out.shape[1]:
            out.addmm_(xa, stacked.parts[0][4])
            return
        for s0, s1, c0, c1, b_t in stacked.parts:
            out[:, c0:c1].addmm_(xa[:, s0:s1], b_t)
        return
    for seg in lora.segments:
        proj = seg.adapter.layers[layer_idx].get(projection)
        if proj is None:
            continue
        if lora.wide_dtype is not None and seg.end - seg.start >= WIDE_GEMM_MIN_ROWS:
            add_wide_segment_delta(out[seg.start:seg.end], x[seg.start:seg.end], proj, lora.wide_dtype)
        else:
            add_segment_delta(out[seg.start:seg.end], x[seg.start:seg.end], proj)


def add_segment_delta(out_rows: torch.Tensor, x_rows: torch.Tensor, proj: LoraProjection) -> None:
    """out_rows += (x_rows @ A) @ B of one adapter's projection (the same ops on the device or a host copy).

    out_rows: [seg_tokens, out_features] (updated in place); x_rows: [seg_tokens, in_features].
    """
    xa = x_rows @ proj.a_t  # [seg_tokens, sum_ranks]
    for r0, r1, c0, c1, b_t in proj.parts:
        out_rows[:, c0:c1].addmm_(xa[:, r0:r1], b_t)


def add_wide_segment_delta(
    out_rows: torch.Tensor, x_rows: torch.Tensor, proj: LoraProjection, wide_dtype: torch.dtype
) -> None:
    """add_segment_delta computed on exact `wide_dtype` upcasts, rounded once into out_rows (prefill-sized
    segments of a bf16 model where the kernel tuner chose fp32 prefill GEMMs, see gpu_workers/kernel_tuner.py)."""
    xa = x_rows.to(wide_dtype) @ proj.a_t.to(wide_dtype)  # [seg_tokens, sum_ranks]
    for r0, r1, c0, c1, b_t in proj.parts:
        cols = out_rows[:, c0:c1]
        cols.copy_(torch.addmm(cols.to(wide_dtype), xa[:, r0:r1], b_t.to(wide_dtype)))


def map_lora_tensors(adapter: LoraAdapter, fn: Callable[[torch.Tensor], torch.Tensor]) -> LoraAdapter:
    """The same adapter with every weight tensor replaced by fn(tensor) (a copy to another device, pinning)."""
    layers = tuple(
        {
            name: LoraProjection(fn(p.a_t), tuple((r0, r1, c0, c1, fn(b)) for r0, r1, c0, c1, b in p.parts))
            for name, p in layer.items()
        }
        for layer in adapter.layers
    )
    a = adapter
    return LoraAdapter(a.adapter_id, a.rank, a.scale, a.target_modules, layers, a.num_bytes)


def build_lora_projection(
    modules: dict[str, tuple[torch.Tensor, torch.Tensor]],
    projection: str,
    output_slices: dict[str, tuple[int, int]],
    scale: float,
    dtype: torch.dtype,
    device: torch.device,
) -> LoraProjection | None:
    """Pack one layer's HF lora_A [r, in] / lora_B [out, r] pairs for the modules of `projection`."""
    a_parts: list[torch.Tensor] = []
    parts: list[tuple[int, int, int, int, torch.Tensor]] = []
    rank_offset = 0
    for module in PROJECTIONS[projection]:
        if module not in modules:
            continue
        lora_a, lora_b = modules[module]
        rank = lora_a.shape[0]
        c0, c1 = output_slices[module]
        b_t = (lora_b.float().t() * scale).to(dtype=dtype, device=device).contiguous()  # [rank, out]
        a_parts.append(lora_a.float().t())  # [in, rank]
        parts.append((rank_offset, rank_offset + rank, c0, c1, b_t))
        rank_offset += rank
    if not parts:
        return None
    a_t = torch.cat(a_parts, dim=1).to(dtype=dtype, device=device).contiguous()  # [in, sum_ranks]
    return LoraProjection(a_t=a_t, parts=tuple(parts))


def build_stacked_lora(adapters: tuple[LoraAdapter, ...], pack: bool = False) -> StackedLora:
    """Concatenate the adapters' per-layer A columns and B rows (grouped by target sub-module); `pack`
    stores them as oneDNN-packed linear weights (see layers/linear.can_pack_linear)."""
    num_layers = len(adapters[0].layers)
    layouts: dict[tuple[tuple[int, int], ...], int] = {}
    owners: list[torch.Tensor] = []
    layers: list[dict[str, StackedProjection]] = []
    num_bytes = 0
    for layer_idx in range(num_layers):
        packed: dict[str, StackedProjection] = {}
        for projection in PROJECTIONS:
            # (col_start, col_end) of a sub-module -> [(adapter position, a columns, b_t)]
            groups: dict[tuple[int, int], list[tuple[int, torch.Tensor, torch.Tensor]]] = {}
            for pos, adapter in enumerate(adapters):
                proj = adapter.layers[layer_idx].get(projection)
                if proj is None:
                    continue
                for r0, r1, c0, c1, b_t in proj.parts:
                    groups.setdefault((c0, c1), []).append((pos, proj.a_t[:, r0:r1], b_t))
            if not groups:
                continue
            a_cols: list[torch.Tensor] = []
            parts: list[tuple[int, int, int, int, torch.Tensor]] = []
            runs: list[tuple[int, int]] = []
            offset = 0
            for (c0, c1), members in sorted(groups.items()):
                start = offset
                for pos, a_cols_m, _ in members:
                    a_cols.append(a_cols_m)
                    runs.append((pos, a_cols_m.shape[1]))
                    offset += a_cols_m.shape[1]
                # [group ranks, out_cols]; finite, so a token's zeroed columns of another adapter add exactly 0
                b_cat = torch.nan_to_num(torch.cat([b for *_, b in members], dim=0))
                parts.append((start, offset, c0, c1, b_cat))
            a_t = torch.cat(a_cols, dim=1)  # [in, S]
            key = tuple(runs)
            if key not in layouts:
                layouts[key] = len(owners)
                owners.append(
                    torch.cat([torch.full((n,), pos, dtype=torch.long) for pos, n in runs]).to(a_t.device)
                )
            num_bytes += a_t.numel() * a_t.element_size() + sum(b.numel() * b.element_size() for *_, b in parts)
            if pack:
                a_t = pack_linear_weight(a_t.t())
                parts = [(s0, s1, c0, c1, pack_linear_weight(b.t())) for s0, s1, c0, c1, b in parts]
            packed[projection] = StackedProjection(a_t, tuple(parts), layouts[key], pack)
        layers.append(packed)
    return StackedLora(adapters=adapters, layers=tuple(layers), owners=tuple(owners), num_bytes=num_bytes)


def stacked_masks(stacked: StackedLora, token_owner: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """token_owner: [num_tokens] adapter position per token (-1: none) -> one [num_tokens, S] bool mask per
    layout, True where the column is another adapter's (dropped)."""
    return tuple(token_owner.unsqueeze(1) != owner.unsqueeze(0) for owner in stacked.owners)


def select_lora_rows(lora: LoraBatch, rows: torch.Tensor) -> LoraBatch:
    """The LoraBatch of batch rows `rows` (ascending) as a batch of their own (row i = rows[i])."""
    if lora.is_empty:
        return lora
    row_list = rows.tolist()
    segments = select_segment_rows(lora.segments, row_list)
    host = lora.host.select_rows(row_list) if lora.host is not None else None
    kernel = lora.kernel.select_rows(row_list) if lora.kernel is not None else None
    if lora.stacked is None:
        return LoraBatch(segments, host=host, kernel=kernel, wide_dtype=lora.wide_dtype)
    masks = tuple(m.index_select(0, rows) for m in lora.masks)
    return LoraBatch(segments, lora.stacked, masks, host, kernel, lora.wide_dtype)


def select_segment_rows(segments: tuple[LoraSegment, ...], row_list: list[int]) -> tuple[LoraSegment, ...]:
    """Segments over the batch rows `row_list` (ascending), renumbered (row i = row_list[i])."""
    selected: list[LoraSegment] = []
    i = 0
    for seg in segments:
        while i < len(row_list) and row_list[i] < seg.start:
            i += 1
        start = i
        while i < len(row_list) and row_list[i] < seg.end:
            i += 1
        if i > start:
            selected.append(LoraSegment(start, i, seg.adapter))
    return tuple(selected)
