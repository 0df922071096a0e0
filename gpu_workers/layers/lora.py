"""Multi-LoRA: per-adapter weights and the segmented (SGMV-style) delta over a batch.

Tokens of a batch are sorted so each adapter's tokens are contiguous (a segment). For every merged
projection (qkv, o, gate_up, down) and every segment we do one x_seg @ A_cat and one addmm per target
sub-module into its output column slice. No per-token weight gather, no padding to a max rank: each
adapter costs its own rank. The LoRA scale is folded into B at load time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

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
class LoraBatch:
    """Per-step segment metadata, built once per step and reused by every layer."""

    segments: tuple[LoraSegment, ...]

    @property
    def is_empty(self) -> bool:
        """True when no token uses an adapter."""
        return not self.segments


def add_lora_delta(
    out: torch.Tensor, x: torch.Tensor, lora: LoraBatch, layer_idx: int, projection: str
) -> None:
    """out[seg] += scale * (x[seg] @ A) @ B for every segment whose adapter targets `projection`.

    out: [num_tokens, out_features] (merged projection output, updated in place); x: [num_tokens, in].
    """
    for seg in lora.segments:
        proj = seg.adapter.layers[layer_idx].get(projection)
        if proj is None:
            continue
        xa = x[seg.start:seg.end] @ proj.a_t  # [seg_tokens, sum_ranks]
        for r0, r1, c0, c1, b_t in proj.parts:
            out[seg.start:seg.end, c0:c1].addmm_(xa[:, r0:r1], b_t)


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
