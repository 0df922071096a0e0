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
weights (`dora_magnitudes`), stored with the adapter (`LoraAdapter.magnitudes`: per layer, per merged
projection the adapter targets, [1 or 2, out_cols] fp32; columns of modules it does not target hold g = 1), and
applied by `DoraStep` as one per-row gather-and-multiply (plain LoRA and base rows get g = 1). Because the
rescale is a form of its own, added last, every LoRA form (segmented, stacked, kernel, Triton, host-assisted)
serves DoRA rows unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from gpu_workers.engine.layers.lora import PROJECTIONS, LoraAdapter, LoraSegment


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


def dora_magnitudes(
    per_layer: Sequence[Mapping[str, tuple[torch.Tensor, torch.Tensor]]],
    per_layer_magnitudes: Sequence[Mapping[str, torch.Tensor]],
    scale: float,
    base_layers: Sequence[Mapping[str, BaseProjection]],
    output_slices: Mapping[str, Mapping[str, tuple[int, int]]],
    device: torch.device,
) -> tuple[dict[str, torch.Tensor], ...]:
    """Per layer, per merged projection the adapter targets: [1 or 2, out_cols] fp32 on `device`, row 0 the
    rescale g = m / ||W + s B A|| (1 in columns of untargeted modules), row 1 (projections with a bias) the
    shift (1 - g) * bias. `per_layer`: module -> (lora_A [r, in], lora_B [out, r]); `per_layer_magnitudes`:
    module -> m [out]; `base_layers[i][projection]`: the worker's base projection of layer i."""
    layers: list[dict[str, torch.Tensor]] = []
    for layer_idx, modules in enumerate(per_layer):
        magnitudes = per_layer_magnitudes[layer_idx]
        packed: dict[str, torch.Tensor] = {}
        for projection, names in PROJECTIONS.items():
            targeted = [m for m in names if m in modules]
            if targeted:
                base = base_layers[layer_idx][projection]
                pairs = {m: (*modules[m], magnitudes[m]) for m in targeted}
                packed[projection] = _projection_magnitudes(
                    pairs, scale, base, output_slices[projection], device
                )
        layers.append(packed)
    return tuple(layers)


def _projection_magnitudes(
    modules: Mapping[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    scale: float,
    base: BaseProjection,
    output_slices: Mapping[str, tuple[int, int]],
    device: torch.device,
) -> torch.Tensor:
    """[1 or 2, out_cols] fp32: g per column of one merged projection (and the bias shift when it has one)."""
    num_cols = max(c1 for _, c1 in output_slices.values())
    g = torch.ones(num_cols, dtype=torch.float32)
    for module, (lora_a, lora_b, magnitude) in modules.items():
        c0, c1 = output_slices[module]
        norms = base.delta_row_norms(c0, c1, lora_a, lora_b.float() * scale)  # [c1 - c0]
        g[c0:c1] = magnitude.float().cpu() / norms.cpu()
    rows = [g]
    if base.bias is not None:
        rows.append((1.0 - g) * base.bias.detach().float().cpu())
    return torch.stack(rows).to(device)  # [1 or 2, out_cols]


def magnitudes_numel(adapter: LoraAdapter) -> int:
    """Elements of an adapter's DoRA magnitudes (0 for plain LoRA)."""
    return sum(t.numel() for layer in adapter.magnitudes for t in layer.values())


@dataclass(frozen=True)
class DoraStep:
    """The DoRA rescale of one step's rows, a LoraDeltaForm added after every other form (see the module doc).

    `adapters`: the step's DoRA adapters (table row i + 1 is adapters[i]; row 0 is the identity, g = 1);
    `row_table`: [num_tokens] int64, each row's table row (0: base or plain LoRA rows). The per-(layer,
    projection) tables are stacked at first use in the step and shared with `select_rows`' copies.
    """

    adapters: tuple[LoraAdapter, ...]
    row_table: torch.Tensor
    tables: dict[tuple[int, str], torch.Tensor | None] = field(default_factory=dict)

    def add_delta(self, out: torch.Tensor, x: torch.Tensor, layer_idx: int, projection: str) -> None:
        """out[rows] = g[rows] * out[rows] (+ (1 - g[rows]) * bias) for every DoRA row; out: [num_tokens,
        out_features] (the base product with every LoRA delta already added); x is not read."""
        table = self._table(layer_idx, projection, out)
        if table is None:
            return
        per_row = table.index_select(0, self.row_table)  # [num_tokens, 1 or 2, out_features]
        out.mul_(per_row[:, 0])
        if per_row.shape[1] > 1:
            out.add_(per_row[:, 1])

    def select_rows(self, row_list: list[int]) -> DoraStep | None:
        """The rescale of batch rows `row_list` (ascending), renumbered; None when none of them is a DoRA row."""
        rows = self.row_table[torch.tensor(row_list, dtype=torch.long, device=self.row_table.device)]
        return DoraStep(self.adapters, rows, self.tables) if bool((rows > 0).any()) else None

    def begin_layer(self, layer_idx: int) -> None:
        """Nothing changes between layers."""

    def _table(self, layer_idx: int, projection: str, out: torch.Tensor) -> torch.Tensor | None:
        """[1 + len(adapters), 1 or 2, out_features] fp32 on out's device, or None when no adapter of the step
        targets this projection of this layer."""
        key = (layer_idx, projection)
        if key not in self.tables:
            self.tables[key] = _stack_table(self.adapters, layer_idx, projection, out)
        return self.tables[key]


def _stack_table(
    adapters: tuple[LoraAdapter, ...], layer_idx: int, projection: str, out: torch.Tensor
) -> torch.Tensor | None:
    found = [a.magnitudes[layer_idx].get(projection) for a in adapters]
    first = next((t for t in found if t is not None), None)
    if first is None:
        return None
    identity = torch.zeros_like(first, device=out.device)
    identity[0] = 1.0
    entries = [identity] + [identity if t is None else t.to(out.device, non_blocking=True) for t in found]
    return torch.stack(entries)


def dora_step(segments: Sequence[LoraSegment], num_tokens: int, device: torch.device) -> DoraStep | None:
    """The rescale of a step's `segments` (device and host-assisted ones), or None when no segment's adapter is
    a DoRA adapter."""
    dora = [seg for seg in segments if seg.adapter.magnitudes]
    if not dora:
        return None
    position: dict[int, int] = {}
    adapters: list[LoraAdapter] = []
    row_table = torch.zeros(num_tokens, dtype=torch.long)
    for seg in dora:
        pos = position.setdefault(id(seg.adapter), len(adapters) + 1)
        if pos == len(adapters) + 1:
            adapters.append(seg.adapter)
        row_table[seg.start : seg.end] = pos
    return DoraStep(tuple(adapters), row_table.to(device))
