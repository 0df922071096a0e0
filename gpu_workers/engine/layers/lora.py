"""Multi-LoRA: per-adapter weights and the segmented (SGMV-style) delta over a batch.

Tokens of a batch are sorted so each adapter's tokens are contiguous (a segment). For every merged
projection (qkv, o, gate_up, down) and every segment there is one x_seg @ A_cat and one addmm per target
sub-module into its output column slice. No per-token weight gather, no padding to a max rank: each
adapter costs its own rank. The LoRA scale is folded into B at load time.

A step's delta comes in forms (`LoraDeltaForm`), each serving its own rows of the batch: `SegmentedStep`
(here), `StackedStep` (layers/stacked_lora.py, decode-sized steps), `KernelStep` (layers/lora_kernel.py, the
CPU kernel) and `HostLora` (layers/host_lora.py, adapters still being copied). A `LoraBatch` holds the step's
forms in the order they add their deltas; this module knows none of the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol, TypeVar

import torch

from gpu_workers.engine.layers.linear import WIDE_GEMM_MIN_ROWS

if TYPE_CHECKING:
    from gpu_workers.engine.layers.vocab_lora import VocabLora

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
    """A loaded adapter: layers[i][projection] -> LoraProjection (absent when not targeted).

    magnitudes (DoRA adapters only, empty for plain LoRA): per layer [1 or 2, C] fp32, the per-column rescale g
    and the bias shift of every merged projection side by side (layers/dora.py); counted in num_bytes.
    vocab (adapters targeting embed_tokens or lm_head, else None): those deltas (layers/vocab_lora.py); counted
    in num_bytes.
    """

    adapter_id: str
    rank: int
    scale: float
    target_modules: tuple[str, ...]
    layers: tuple[dict[str, LoraProjection], ...]
    num_bytes: int
    magnitudes: tuple[torch.Tensor, ...] = ()
    vocab: VocabLora | None = None

    @property
    def is_dora(self) -> bool:
        """True for a DoRA adapter (its rows are rescaled by its magnitudes)."""
        return bool(self.magnitudes)

    @property
    def has_projection_deltas_only(self) -> bool:
        """True when every delta is on a decoder projection (no DoRA rescale, no embed_tokens / lm_head LoRA):
        what a captured decode step's slot table holds (decode_graphs.py)."""
        return not self.magnitudes and self.vocab is None


@dataclass(frozen=True)
class LoraSegment:
    """Tokens [start, end) of the batch all use `adapter`."""

    start: int
    end: int
    adapter: LoraAdapter


class LoraDeltaForm(Protocol):
    """One form of a step's LoRA delta, serving its own rows of the batch."""

    def add_delta(self, out: torch.Tensor, x: torch.Tensor, layer_idx: int, projection: str) -> None:
        """out[rows] += x[rows] @ A @ B for the rows this form serves, adapters targeting `projection` only.

        out: [num_tokens, out_features] (merged projection output, updated in place); x: [num_tokens, in].
        """
        ...

    def select_rows(self, row_list: list[int]) -> LoraDeltaForm | None:
        """The same form over batch rows `row_list` (ascending), renumbered (row i = row_list[i]); None when
        it serves none of them."""
        ...

    def begin_layer(self, layer_idx: int) -> None:
        """A layer boundary of the step (before layer `layer_idx` runs)."""
        ...


FormT = TypeVar("FormT")


@dataclass(frozen=True)
class LoraBatch:
    """Per-step LoRA metadata, built once per step and reused by every layer: the step's delta forms, in the
    order their deltas are added (forms that still write rows on CPU workers, like HostLora, go last)."""

    forms: tuple[LoraDeltaForm, ...] = ()

    @property
    def is_empty(self) -> bool:
        """True when no token uses an adapter."""
        return not self.forms

    def begin_layer(self, layer_idx: int) -> None:
        """Tell every form that layer `layer_idx` begins."""
        for form in self.forms:
            form.begin_layer(layer_idx)

    def find(self, kind: type[FormT]) -> FormT | None:
        """The step's form of type `kind`, or None."""
        return next((form for form in self.forms if isinstance(form, kind)), None)


def lora_batch(*forms: LoraDeltaForm | None) -> LoraBatch:
    """A LoraBatch of `forms` in this order, without the absent ones (None)."""
    return LoraBatch(tuple(form for form in forms if form is not None))


def add_lora_delta(
    out: torch.Tensor, x: torch.Tensor, lora: LoraBatch, layer_idx: int, projection: str
) -> None:
    """out[seg] += scale * (x[seg] @ A) @ B for every segment whose adapter targets `projection`, form by form.

    out: [num_tokens, out_features] (merged projection output, updated in place); x: [num_tokens, in].
    """
    for form in lora.forms:
        form.add_delta(out, x, layer_idx, projection)


@dataclass(frozen=True)
class SegmentedStep:
    """One x_seg @ A and one addmm per target sub-module per segment (the simplest form).

    `wide_dtype` (float32 for a bf16 model whose prefill GEMMs run wide, see layers/linear.MergedLinear):
    segments of at least WIDE_GEMM_MIN_ROWS tokens multiply exact upcasts and round once into `out`.
    """

    segments: tuple[LoraSegment, ...]
    wide_dtype: torch.dtype | None = None

    def add_delta(self, out: torch.Tensor, x: torch.Tensor, layer_idx: int, projection: str) -> None:
        """out[seg] += x[seg] @ A @ B for every segment. out: [num_tokens, out_features]; x: [num_tokens, in]."""
        for seg in self.segments:
            proj = seg.adapter.layers[layer_idx].get(projection)
            if proj is None:
                continue
            if self.wide_dtype is not None and seg.end - seg.start >= WIDE_GEMM_MIN_ROWS:
                rows = slice(seg.start, seg.end)
                add_wide_segment_delta(out[rows], x[rows], proj, self.wide_dtype)
            else:
                add_segment_delta(out[seg.start : seg.end], x[seg.start : seg.end], proj)

    def select_rows(self, row_list: list[int]) -> SegmentedStep | None:
        """The segments over batch rows `row_list` (ascending); None when no row uses an adapter."""
        segments = select_segment_rows(self.segments, row_list)
        return SegmentedStep(segments, self.wide_dtype) if segments else None

    def begin_layer(self, layer_idx: int) -> None:
        """Nothing changes between layers."""


def segmented_step(
    segments: tuple[LoraSegment, ...], wide_dtype: torch.dtype | None = None
) -> SegmentedStep | None:
    """The segmented form of `segments`, or None when there is none."""
    return SegmentedStep(segments, wide_dtype) if segments else None


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
    segments of a bf16 model where the kernel tuner chose fp32 prefill GEMMs, see gpu_workers/engine/kernel_tuner.py)."""
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
    magnitudes = tuple(fn(t) for t in adapter.magnitudes)
    vocab = adapter.vocab.map(fn) if adapter.vocab is not None else None
    return replace(adapter, layers=layers, magnitudes=magnitudes, vocab=vocab)


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


def select_lora_rows(lora: LoraBatch, rows: torch.Tensor) -> LoraBatch:
    """The LoraBatch of batch rows `rows` (ascending) as a batch of their own (row i = rows[i])."""
    if lora.is_empty:
        return lora
    row_list = rows.tolist()
    return lora_batch(*(form.select_rows(row_list) for form in lora.forms))


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
