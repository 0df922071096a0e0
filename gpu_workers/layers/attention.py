"""Paged-KV attention: write new K/V into the page pool, causal SDPA for prefill chunks (adjacent
whole-prompt chunks of equal length in one batched call), one SDPA over the gathered pages of all decode
tokens.

KV cache per layer: k_cache, v_cache [num_blocks * block_size, num_kv_heads, head_dim] (flat slot view of
[num_blocks, block_size, num_kv_heads, head_dim]); slot = block_id * block_size + offset. Decode gathers
whole pages (one contiguous block_size * num_kv_heads * head_dim run per page).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class PrefillChunk:
    """Tokens [start, end) of the batch are positions [context_len - (end-start), context_len) of one seq.

    context_slots: [context_len] cache slots of the whole context, None when the chunk is the whole context
    (then K/V come straight from this step). mask: [q_len, context_len] bool (True = attend), None = causal.
    num_seqs > 1: [start, end) holds that many adjacent whole-context prompts of equal length (batched).
    """

    start: int
    end: int
    context_slots: torch.Tensor | None
    mask: torch.Tensor | None
    num_seqs: int = 1


@dataclass(frozen=True)
class AttentionMetadata:
    """Per-step attention inputs, shared by every layer.

    slot_mapping: [num_tokens] cache slot of each new token.
    decode_token_idx: [num_decodes] batch rows of single-token (decode) queries, or None.
    decode_blocks: [num_decodes, max_blocks] KV pages to gather (padding uses page 0, which may be another
        sequence's: masked out).
    decode_mask: [num_decodes, 1, 1, max_blocks * block_size] bool, True where the context position is real
        (< the sequence's length); None when no position is padding.
    decode_pad_rows: [num_padding] rows of the gathered [num_decodes * max_blocks * block_size] positions that
        are padding (~decode_mask), or None.
    block_size: tokens per KV page.

    Isolation: a padding position's K (another sequence's page, or a stale slot of a freed page) is *set* to
    0 in the gathered copy before scoring, so its score is exactly q . 0 = 0 before the mask makes it -inf
    (never inf + -inf = NaN), and every value written to the cache is finite, so its V times probability 0
    is exactly 0: a neighbour that overflowed cannot reach another sequence's output.
    """

    slot_mapping: torch.Tensor
    prefills: tuple[PrefillChunk, ...]
    decode_token_idx: torch.Tensor | None
    decode_blocks: torch.Tensor | None
    decode_mask: torch.Tensor | None
    decode_pad_rows: torch.Tensor | None
    is_all_decode: bool
    block_size: int


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """q: [T, Hq, D]; k, v: [T, Hkv, D] for the new tokens -> output [T, Hq, D]."""
    # finite in the cache (NaN -> 0, +-inf -> +-max): a masked slot times probability 0 is exactly 0
    k_cache.index_copy_(0, meta.slot_mapping, torch.nan_to_num(k))
    v_cache.index_copy_(0, meta.slot_mapping, torch.nan_to_num(v))
    out = torch.empty_like(q) if not meta.is_all_decode else None
    for chunk in meta.prefills:
        assert out is not None
        out[chunk.start:chunk.end] = _prefill_attention(q, k, v, k_cache, v_cache, chunk, scale)
    if meta.decode_token_idx is None:
        assert out is not None
        return out
    decoded = _decode_attention(q, k_cache, v_cache, meta, scale)
    if out is None:
        return decoded
    out.index_copy_(0, meta.decode_token_idx, decoded)
    return out


def _prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    chunk: PrefillChunk,
    scale: float,
) -> torch.Tensor:
    """Causal attention of one prompt chunk (or num_seqs equal whole prompts) -> [q_len, Hq, D]."""
    n = chunk.num_seqs
    _, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    q_c = q[chunk.start:chunk.end].view(n, -1, num_heads, head_dim).transpose(1, 2)  # [n, Hq, q_len, D]
    if chunk.context_slots is None:
        k_c = k[chunk.start:chunk.end].view(n, -1, num_kv_heads, head_dim).transpose(1, 2)  # [n, Hkv, L, D]
        v_c = v[chunk.start:chunk.end].view(n, -1, num_kv_heads, head_dim).transpose(1, 2)
    else:
        k_c = k_cache.index_select(0, chunk.context_slots).transpose(0, 1).unsqueeze(0)  # [1, Hkv, ctx, D]
        v_c = v_cache.index_select(0, chunk.context_slots).transpose(0, 1).unsqueeze(0)
    o = F.scaled_dot_product_attention(
        q_c, k_c, v_c, attn_mask=chunk.mask, is_causal=chunk.mask is None, scale=scale, enable_gqa=True
    )
    return o.transpose(1, 2).reshape(chunk.end - chunk.start, num_heads, head_dim)


def _decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    """All single-token queries at once over their gathered pages -> [num_decodes, Hq, D].

    One index_select per K and V gathers whole pages ([B, max_context, Hkv, D], the cache layout); SDPA reads
    them through a transposed view (no copy) and serves each query head group from its kv head (GQA).
    """
    assert meta.decode_blocks is not None and meta.decode_token_idx is not None
    num_decodes, max_blocks = meta.decode_blocks.shape
    _, num_kv_heads, head_dim = k_cache.shape
    num_heads = q.shape[1]
    block_size = meta.block_size
    max_context = max_blocks * block_size
    flat = meta.decode_blocks.view(-1)
    page = block_size * num_kv_heads * head_dim
    k_d = k_cache.view(-1, page).index_select(0, flat).view(num_decodes, max_context, num_kv_heads, head_dim)
    v_d = v_cache.view(-1, page).index_select(0, flat).view(num_decodes, max_context, num_kv_heads, head_dim)
    if meta.decode_pad_rows is not None:  # padding scores exactly 0 before the mask (see AttentionMetadata)
        k_d.view(num_decodes * max_context, -1).index_fill_(0, meta.decode_pad_rows, 0.0)
    q_d = q if meta.is_all_decode else q.index_select(0, meta.decode_token_idx)  # [B, Hq, D]
    out = F.scaled_dot_product_attention(
        q_d.unsqueeze(2), k_d.transpose(1, 2), v_d.transpose(1, 2), attn_mask=meta.decode_mask, scale=scale,
        enable_gqa=num_heads != num_kv_heads,
    )  # [B, Hq, 1, D]
    return out.view(num_decodes, num_heads, head_dim)
