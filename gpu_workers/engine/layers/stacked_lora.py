"""The stacked form of a decode-sized step's LoRA delta.

Decode-sized steps (many segments of a token or two) would pay hundreds of tiny matmuls per step in the
segmented form, each dominated by per-call overhead. The stacked form instead concatenates, per layer and
projection, the batch's adapters' A (columns) and B (rows) once per adapter set (cached by the runner, see
`StackedLora`), so a projection costs one x @ A_cat, one masked fill by a [num_tokens, sum_ranks] bool mask
(each token keeps only its own adapter's columns; built once per step, shared by all layers) and one addmm
per target sub-module. Its cost is proportional to the sum of the batch's ranks, still with no padding.

Isolation: x @ A_cat computes every token against every adapter, so a token's columns of another adapter may
hold inf/NaN when that adapter overflows. They are *set* to exactly 0 (masked_fill, never a multiply:
inf * 0 = NaN), and the stacked B rows are made finite at build time (0 * inf = NaN too), so a token's delta
depends only on its own adapter's weights. Tokens of no adapter (or of a host-assisted one) get exactly 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gpu_workers.engine.layers.linear import pack_linear_weight, packed_linear
from gpu_workers.engine.layers.lora import PROJECTIONS, LoraAdapter, LoraSegment, select_segment_rows


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
class StackedStep:
    """One step's stacked form: `segments` (their adapters in `stacked.adapters` order) and masks[layout],
    [num_tokens, S] bool, True where the column belongs to another adapter than the token's (dropped; tokens
    without adapter: all True)."""

    segments: tuple[LoraSegment, ...]
    stacked: StackedLora
    masks: tuple[torch.Tensor, ...]

    def add_delta(self, out: torch.Tensor, x: torch.Tensor, layer_idx: int, projection: str) -> None:
        """out += (x @ A_cat, other adapters' columns zeroed) @ B_cat. out: [num_tokens, out_features]."""
        stacked = self.stacked.layers[layer_idx].get(projection)
        if stacked is None:
            return
        if stacked.is_packed:
            xa = packed_linear(x, stacked.a_t).masked_fill_(
                self.masks[stacked.layout], 0.0
            )  # [num_tokens, S]
            for s0, s1, c0, c1, b_packed in stacked.parts:
                out[:, c0:c1] += packed_linear(xa[:, s0:s1], b_packed)
            return
        xa = torch.mm(x, stacked.a_t).masked_fill_(self.masks[stacked.layout], 0.0)  # [num_tokens, S]
        if len(stacked.parts) == 1 and stacked.parts[0][3] - stacked.parts[0][2] == out.shape[1]:
            out.addmm_(xa, stacked.parts[0][4])
            return
        for s0, s1, c0, c1, b_t in stacked.parts:
            out[:, c0:c1].addmm_(xa[:, s0:s1], b_t)

    def select_rows(self, row_list: list[int]) -> StackedStep | None:
        """The same stacked weights over batch rows `row_list` (ascending); None when no row uses an adapter."""
        segments = select_segment_rows(self.segments, row_list)
        if not segments:
            return None
        index = torch.tensor(row_list, dtype=torch.long, device=self.masks[0].device) if self.masks else None
        masks = tuple(m.index_select(0, index) for m in self.masks) if index is not None else ()
        return StackedStep(segments, self.stacked, masks)

    def begin_layer(self, layer_idx: int) -> None:
        """Nothing changes between layers."""


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
            num_bytes += a_t.numel() * a_t.element_size() + sum(
                b.numel() * b.element_size() for *_, b in parts
            )
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
