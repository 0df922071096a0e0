"""DoRA (weight-decomposed LoRA, peft's use_dora): the magnitude rescale of each DoRA row, one post-op after
every other form's delta.

peft computes, per adapted module with weight W [out, in], LoRA scale s (alpha/r, or alpha/sqrt(r) with rsLoRA)
and trained magnitude m [out]:
    weight_norm = ||W + s * B @ A||_2 per output row (detached, so a constant at inference)
    g = m / weight_norm
    y = g * (x W^T + s * x A^T B^T) + bias
So a DoRA row is a plain LoRA row (base product plus delta, which every LoRA form computes) rescaled per output
column by g, with the bias kept outside g: y = g * y_lora + (1 - g) * bias. g (and the bias shift
(1 - g) * bias where the projection has a bias) is computed once per adapter at load from the worker's base
weights (`dora_magnitudes`), stored with the adapter (`LoraAdapter.magnitudes`: per layer one [1 or 2, C] fp32
tensor, C the output columns of every merged projection side by side in PROJECTIONS order (`magnitude_columns`);
columns of modules it does not target hold g = 1 and shift 0), and applied by `DoraStep`: per layer one gather of
each row's g (plain LoRA and base rows get g = 1), then one multiply per projection. Because the
rescale is a form of its own, added last, every LoRA form (segmented, stacked, kernel, Triton, host-assisted)
serves DoRA rows unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from gpu_workers.engine.layers.lora import PROJECTIONS, LoraSegment, select_segment_rows


class BaseProjection(Protocol):
    """What DoRA needs of a merged base projection (layers/linear.MergedLinear)."""

    @property
    def bias(self) -> torch.Tensor | None:
        """The projection's bias [out_cols], or None."""
        ...

    def delta_row_norms(
        self, col_start: int, col_end: int, lora_a: torch.Tensor, b_scaled: torch.Tensor
    ) -> torch.Tensor:
        """||W[c0:c1] + b_scaled @ lora_a||_2 per output row, fp32 [c1 - c0]."""
        ...


def magnitude_columns(
    output_slices: Mapping[str, Mapping[str, tuple[int, int]]],
) -> dict[str, tuple[int, int]]:
    """projection -> its columns [c0, c1) in a layer's magnitudes: the merged projections side by side in
    PROJECTIONS order (`output_slices[projection][module]`: the module's columns in its projection)."""
    columns: dict[str, tuple[int, int]] = {}
    offset = 0
    for projection in PROJECTIONS:
        width = max(c1 for _, c1 in output_slices[projection].values())
        columns[projection] = (offset, offset + width)
        offset += width
    return columns


def dora_magnitudes(
    per_layer: Sequence[Mapping[str, tuple[torch.Tensor, torch.Tensor]]],
    per_layer_magnitudes: Sequence[Mapping[str, torch.Tensor]],
    scale: float,
    base_layers: Sequence[Mapping[str, BaseProjection]],
    output_slices: Mapping[str, Mapping[str, tuple[int, int]]],
    device: torch.device,
) -> tuple[torch.Tensor, ...]:
    """Per layer: [1 or 2, C] fp32 on `device` (see magnitude_columns): row 0 the rescale g = m / ||W + s B A||
    (1 in columns of modules the adapter does not target), row 1 (models with biases) the shift (1 - g) * bias.
    `per_layer`: module -> (lora_A [r, in], lora_B [out, r]); `per_layer_magnitudes`: module -> m [out];
    `base_layers[i][projection]`: the worker's base projection of layer i."""
    columns = magnitude_columns(output_slices)
    has_bias = any(base.bias is not None for base in base_layers[0].values())
    layers: list[torch.Tensor] = []
    for layer_idx, modules in enumerate(per_layer):
        g = torch.ones(max(c1 for _, c1 in columns.values()), dtype=torch.float32)
        shift = torch.zeros_like(g)
        for projection, names in PROJECTIONS.items():
            base = base_layers[layer_idx][projection]
            p0 = columns[projection][0]
            for module in (m for m in names if m in modules):
                c0, c1 = output_slices[projection][module]
                lora_a, lora_b = modules[module]
                norms = base.delta_row_norms(c0, c1, lora_a, lora_b.float() * scale)  # [c1 - c0]
                g[p0 + c0 : p0 + c1] = per_layer_magnitudes[layer_idx][module].float() / norms.cpu()
            if base.bias is not None:
                p1 = columns[projection][1]
                shift[p0:p1] = (1.0 - g[p0:p1]) * base.bias.detach().float().cpu()
        layers.append(torch.stack([g, shift] if has_bias else [g]).to(device))  # [1 or 2, C]
    return tuple(layers)


# Steps of at most this many rows gather each row's g (one [rows, 1 or 2, C] copy per layer); longer ones (prefill
# chunks: few segments, many rows) multiply each DoRA segment's rows by its adapter's g, broadcast.
MAX_GATHER_ROWS = 256


@dataclass(frozen=True)
class DoraStep:
    """The DoRA rescale of one step's rows, a LoraDeltaForm added after every other form (see the module doc).

    `segments`: the step's segments whose adapter is a DoRA adapter (device or host copies); `num_tokens`: the
    step's rows; `columns`: magnitude_columns of the model. A layer's per-row table ([num_tokens, 1 or 2, C]:
    each DoRA row its adapter's magnitudes, other rows g = 1) is gathered at the layer's first projection and
    kept for its others.
    """

    segments: tuple[LoraSegment, ...]
    num_tokens: int
    columns: Mapping[str, tuple[int, int]]
    _rows: dict[int, torch.Tensor] = field(default_factory=dict)

    def add_delta(self, out: torch.Tensor, x: torch.Tensor, layer_idx: int, projection: str) -> None:
        """out[rows] = g[rows] * out[rows] (+ (1 - g[rows]) * bias) for every DoRA row; out: [num_tokens,
        out_features] (the base product with every LoRA delta already added); x is not read."""
        c0, c1 = self.columns[projection]
        if self.num_tokens > MAX_GATHER_ROWS:
            for seg in self.segments:
                table = seg.adapter.magnitudes[layer_idx].to(out.device, non_blocking=True)
                _rescale(out[seg.start : seg.end], table[:, c0:c1])
            return
        rows = self._rows.get(layer_idx)
        if rows is None:
            rows = self._rows[layer_idx] = self._gather(layer_idx, out.device)
        _rescale(out, rows[:, :, c0:c1])

    def select_rows(self, row_list: list[int]) -> DoraStep | None:
        """The rescale of batch rows `row_list` (ascending), renumbered; None when none of them is a DoRA row."""
        segments = select_segment_rows(self.segments, row_list)
        return DoraStep(segments, len(row_list), self.columns) if segments else None

    def begin_layer(self, layer_idx: int) -> None:
        """A new layer: the previous layer's table goes."""
        self._rows.pop(layer_idx - 1, None)

    def _gather(self, layer_idx: int, device: torch.device) -> torch.Tensor:
        """[num_tokens, 1 or 2, C]: each DoRA segment's adapter magnitudes, identity rows elsewhere."""
        first = self.segments[0].adapter.magnitudes[layer_idx]
        identity = torch.zeros_like(first, device=device)  # [1 or 2, C]
        identity[0] = 1.0
        parts: list[torch.Tensor] = []
        row = 0
        for seg in self.segments:
            if seg.start > row:
                parts.append(identity.expand(seg.start - row, *identity.shape))
            table = seg.adapter.magnitudes[layer_idx].to(device, non_blocking=True)
            parts.append(table.expand(seg.end - seg.start, *table.shape))
            row = seg.end
        if row < self.num_tokens:
            parts.append(identity.expand(self.num_tokens - row, *identity.shape))
        return torch.cat(parts)


def _rescale(out: torch.Tensor, table: torch.Tensor) -> None:
    """out = out * table[:, 0] (+ table[:, 1]); table: [rows or 1-broadcast, 1 or 2, out_features]."""
    if table.dim() == 2:  # one adapter's [1 or 2, cols], broadcast over the rows
        table = table.unsqueeze(0)
    out.mul_(table[:, 0])
    if table.shape[1] > 1:
        out.add_(table[:, 1])


def dora_step(
    segments: Sequence[LoraSegment], num_tokens: int, columns: Mapping[str, tuple[int, int]]
) -> DoraStep | None:
    """The rescale of a step's `segments` (device and host-assisted ones, in any order), or None when no
    segment's adapter is a DoRA adapter."""
    dora = sorted((seg for seg in segments if seg.adapter.magnitudes), key=lambda seg: seg.start)
    return DoraStep(tuple(dora), num_tokens, columns) if dora else None
