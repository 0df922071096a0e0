"""LoRA on the vocabulary-sized modules (peft target_modules "embed_tokens" and "lm_head").

peft's LoRA on the token embedding (an nn.Embedding, weight E [vocab, hidden]) saves lora_embedding_A [r, vocab]
and lora_embedding_B [hidden, r] and computes, for token t,
    h_t = E[t] + s * A[:, t]^T B^T
so its delta is a per-row gather: row t of A^T ([vocab, r], `embed_rows`) times the scaled B^T ([r, hidden]).
On the LM head (a Linear [vocab, hidden]) it is the usual lora_A [r, hidden] / lora_B [vocab, r] pair:
    logits = norm(h) W^T + s * (norm(h) A^T) B^T
which runs through the segmented (SGMV-style) path of layers/lora.py: one x_seg @ A and one addmm per adapter
segment. With tied embeddings (SmolLM2) the two LoRAs stay separate, each on its own module, as peft applies
them (the base weight is shared, the deltas are not).

`VocabStep` is a LoraDeltaForm that adds nothing to the decoder projections; the model asks it for the
embedding delta of the step's tokens and the runner for the head delta of the rows it samples.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from gpu_workers.engine.layers.lora import LoraProjection, LoraSegment, add_segment_delta, select_segment_rows


@dataclass(frozen=True)
class VocabLora:
    """One adapter's LoRA on embed_tokens and/or lm_head (absent parts None).

    embed_rows: [vocab, r] (lora_embedding_A^T: row t is token t's A column); embed_b_t: [r, hidden] (scale *
    lora_embedding_B^T); head: a LoraProjection with a_t [hidden, r] and one part (0, r, 0, vocab, b_t [r, vocab]).
    """

    embed_rows: torch.Tensor | None = None
    embed_b_t: torch.Tensor | None = None
    head: LoraProjection | None = None

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """Every tensor, in layout order (embedding first, then the head)."""
        embed = () if self.embed_rows is None or self.embed_b_t is None else (self.embed_rows, self.embed_b_t)
        head = () if self.head is None else (self.head.a_t, *(b for *_, b in self.head.parts))
        return (*embed, *head)

    @property
    def num_bytes(self) -> int:
        """Bytes of every tensor."""
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> VocabLora:
        """The same LoRA with every tensor replaced by fn(tensor), in `tensors` order (a copy, a placement)."""
        mapped = iter([fn(t) for t in self.tensors()])
        embed_rows = embed_b_t = None
        if self.embed_rows is not None:
            embed_rows, embed_b_t = next(mapped), next(mapped)
        head = None
        if self.head is not None:
            a_t = next(mapped)
            head = LoraProjection(
                a_t, tuple((r0, r1, c0, c1, next(mapped)) for r0, r1, c0, c1, _ in self.head.parts)
            )
        return VocabLora(embed_rows, embed_b_t, head)


def build_vocab_lora(
    pairs: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
    scale: float,
    dtype: torch.dtype,
    device: torch.device,
) -> VocabLora | None:
    """Pack peft's pairs (module -> (A, B)): embed_tokens (lora_embedding_A [r, vocab], lora_embedding_B
    [hidden, r]) and lm_head (lora_A [r, hidden], lora_B [vocab, r]); None when neither is present."""
    if not pairs:
        return None
    embed_rows = embed_b_t = None
    if "embed_tokens" in pairs:
        a, b = pairs["embed_tokens"]
        embed_rows = a.float().t().to(dtype=dtype, device=device).contiguous()  # [vocab, r]
        embed_b_t = (b.float().t() * scale).to(dtype=dtype, device=device).contiguous()  # [r, hidden]
    head = None
    if "lm_head" in pairs:
        a, b = pairs["lm_head"]
        rank, vocab = a.shape[0], b.shape[0]
        b_t = (b.float().t() * scale).to(dtype=dtype, device=device).contiguous()  # [r, vocab]
        a_t = a.float().t().to(dtype=dtype, device=device).contiguous()  # [hidden, r]
        head = LoraProjection(a_t, ((0, rank, 0, vocab, b_t),))
    return VocabLora(embed_rows, embed_b_t, head)


@dataclass(frozen=True)
class VocabStep:
    """The embedding and head deltas of one step's rows: `segments` are those whose adapter has a VocabLora
    (device or host copies, by row), `num_tokens` the step's rows. Adds nothing to the decoder projections."""

    segments: tuple[LoraSegment, ...]
    num_tokens: int

    def add_delta(self, out: torch.Tensor, x: torch.Tensor, layer_idx: int, projection: str) -> None:
        """No delta on a decoder projection."""

    def select_rows(self, row_list: list[int]) -> VocabStep | None:
        """The deltas of batch rows `row_list` (ascending), renumbered; None when none of them has one."""
        segments = select_segment_rows(self.segments, row_list)
        return VocabStep(segments, len(row_list)) if segments else None

    def begin_layer(self, layer_idx: int) -> None:
        """Nothing changes between layers."""

    def add_embedding_delta(self, h: torch.Tensor, input_ids: torch.Tensor) -> None:
        """h[seg] += A^T[ids] @ (s B^T) for every segment with an embedding LoRA: a per-row gather of A's
        columns. h: [num_tokens, hidden] (updated in place); input_ids: [num_tokens]."""
        for seg in self.segments:
            vocab = seg.adapter.vocab
            if vocab is None or vocab.embed_rows is None or vocab.embed_b_t is None:
                continue
            ids = input_ids[seg.start : seg.end].to(vocab.embed_rows.device)
            rows = vocab.embed_rows.index_select(0, ids)  # [seg_tokens, r]
            delta = (rows @ vocab.embed_b_t).to(h.device, non_blocking=True)  # [seg_tokens, hidden]
            h[seg.start : seg.end] += delta

    def add_head_delta(self, out: torch.Tensor, x: torch.Tensor) -> None:
        """out[seg] += (x[seg] @ A^T) @ (s B^T) for every segment with a head LoRA (the segmented path).
        out: [num_tokens, vocab] (logits, updated in place); x: [num_tokens, hidden] (the normed rows)."""
        for seg in self.segments:
            vocab = seg.adapter.vocab
            if vocab is None or vocab.head is None:
                continue
            head = vocab.head
            if head.a_t.device != out.device:  # a host copy (CPU-assisted prefill) on an accelerator
                head = LoraProjection(
                    head.a_t.to(out.device), tuple((*p[:4], p[4].to(out.device)) for p in head.parts)
                )
            add_segment_delta(out[seg.start : seg.end], x[seg.start : seg.end], head)


def vocab_step(segments: Sequence[LoraSegment], num_tokens: int) -> VocabStep | None:
    """The vocabulary deltas of a step's `segments` (device and host-assisted ones, any order), or None when no
    segment's adapter targets embed_tokens or lm_head."""
    vocab = sorted((seg for seg in segments if seg.adapter.vocab is not None), key=lambda seg: seg.start)
    return VocabStep(tuple(vocab), num_tokens) if vocab else None


def select_head_rows(step: VocabStep | None, rows: torch.Tensor | list[int]) -> VocabStep | None:
    """The deltas of `step`'s rows `rows` (ascending), renumbered (row i = rows[i]); None without any."""
    if step is None:
        return None
    return step.select_rows(rows.tolist() if isinstance(rows, torch.Tensor) else rows)
