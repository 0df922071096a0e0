"""The Triton kernels of the paged attention (gpu_workers/engine/layers/triton_attention.py: layouts, softmax and
the interpreter's bf16 note are documented there): decode over each sequence's pages (split or not), the merge of
split partial results, and varlen prefill over the pages. Importing this module needs triton.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction


@triton.jit
def _dot(a, b, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """a @ b in fp32 (UPCAST: on fp32 copies of a and b)."""
    if UPCAST:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        out = tl.dot(a, b, input_precision=DOT_PRECISION)
    return out


@triton.jit
def decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    tables_ptr,
    lens_ptr,
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    qk_scale,
    stride_q_seq,
    stride_q_head,
    stride_cache_slot,
    stride_cache_head,
    stride_table_seq,
    stride_out_seq,
    stride_out_head,
    NUM_Q_PER_KV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """One program: one sequence, one kv head (all its query heads as rows), one split of the context.
    NUM_SPLITS == 1 writes the output; else the split's normalised partial output and its log2-sum-exp."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(lens_ptr + seq)
    split_len = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    rows = tl.arange(0, BLOCK_H)
    heads = kv_head * NUM_Q_PER_KV + rows
    row_mask = rows < NUM_Q_PER_KV
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    q_offsets = seq * stride_q_seq + heads[:, None] * stride_q_head + d[None, :]
    q = tl.load(q_ptr + q_offsets, mask=row_mask[:, None] & d_mask[None, :], other=0.0)  # [BLOCK_H, BLOCK_D]

    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    table_row = tables_ptr + seq * stride_table_seq
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        pos_mask = pos < end
        page = tl.load(table_row + pos // BLOCK_SIZE, mask=pos_mask, other=0).to(tl.int64)
        slot = page * BLOCK_SIZE + pos % BLOCK_SIZE
        kv_offsets = slot[:, None] * stride_cache_slot + kv_head * stride_cache_head + d[None, :]
        kv_mask = pos_mask[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
        scores = _dot(q, tl.trans(k), UPCAST, DOT_PRECISION) * qk_scale  # [BLOCK_H, BLOCK_N]
        scores = tl.where(pos_mask[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, 1))  # finite: every tile has a real position
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, UPCAST, DOT_PRECISION)
        m = m_new

    is_empty = l == 0.0  # a split past the sequence's end (only with NUM_SPLITS > 1)
    out = acc / tl.where(is_empty, 1.0, l)[:, None]
    out_mask = row_mask[:, None] & d_mask[None, :]
    if NUM_SPLITS == 1:
        out_offsets = seq * stride_out_seq + heads[:, None] * stride_out_head + d[None, :]
        tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        # partials: [num_seqs, num_heads, NUM_SPLITS, BLOCK_D] and [num_seqs, num_heads, NUM_SPLITS], contiguous
        part_rows = (seq * (tl.num_programs(1) * NUM_Q_PER_KV) + heads) * NUM_SPLITS + split
        tl.store(part_out_ptr + part_rows[:, None] * BLOCK_D + d[None, :], out, mask=out_mask)
        lse = tl.where(is_empty, float("-inf"), m + tl.log2(tl.where(is_empty, 1.0, l)))
        tl.store(part_lse_ptr + part_rows, lse, mask=row_mask)


@triton.jit
def merge_splits_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    stride_out_seq,
    stride_out_head,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One program: one sequence, one query head; the splits' partial outputs weighted by their sums."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    row = seq * tl.num_programs(1) + head
    s = tl.arange(0, BLOCK_S)
    s_mask = s < NUM_SPLITS
    d = tl.arange(0, BLOCK_D)
    lse = tl.load(part_lse_ptr + row * NUM_SPLITS + s, mask=s_mask, other=float("-inf"))  # [BLOCK_S]
    weights = tl.exp2(lse - tl.max(lse, 0))  # the first split is never empty: the max is finite
    parts_offsets = (row * NUM_SPLITS + s)[:, None] * BLOCK_D + d[None, :]
    parts = tl.load(part_out_ptr + parts_offsets, mask=s_mask[:, None], other=0.0)  # [BLOCK_S, BLOCK_D]
    out = tl.sum(parts * weights[:, None], 0) / tl.sum(weights, 0)
    out_offsets = seq * stride_out_seq + head * stride_out_head + d
    tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


@triton.jit
def prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    tables_ptr,
    q_starts_ptr,
    q_lens_ptr,
    context_lens_ptr,
    out_ptr,
    qk_scale,
    stride_q_token,
    stride_q_head,
    stride_cache_slot,
    stride_cache_head,
    stride_table_seq,
    stride_out_token,
    stride_out_head,
    NUM_Q_PER_KV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """One program: BLOCK_M query rows of one chunk, one query head. The chunk's rows are positions
    [context_len - q_len, context_len) of its sequence; row at position t attends to positions [0, t]."""
    chunk = tl.program_id(0)
    head = tl.program_id(1)
    m_block = tl.program_id(2)
    q_len = tl.load(q_lens_ptr + chunk)
    if m_block * BLOCK_M >= q_len:
        return
    q_start = tl.load(q_starts_ptr + chunk)
    context_len = tl.load(context_lens_ptr + chunk)
    first_pos = context_len - q_len
    kv_head = head // NUM_Q_PER_KV

    rows = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < q_len
    q_pos = first_pos + rows  # [BLOCK_M]; rows past q_len sit past the context and are never stored
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    token = (q_start + rows).to(tl.int64)
    q_offsets = token[:, None] * stride_q_token + head * stride_q_head + d[None, :]
    q = tl.load(q_ptr + q_offsets, mask=row_mask[:, None] & d_mask[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table_row = tables_ptr + chunk * stride_table_seq
    end = tl.minimum(context_len, first_pos + (m_block + 1) * BLOCK_M)  # causal: up to the block's last row
    for n0 in range(0, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        pos_mask = pos < end
        page = tl.load(table_row + pos // BLOCK_SIZE, mask=pos_mask, other=0).to(tl.int64)
        slot = page * BLOCK_SIZE + pos % BLOCK_SIZE
        kv_offsets = slot[:, None] * stride_cache_slot + kv_head * stride_cache_head + d[None, :]
        kv_mask = pos_mask[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
        scores = _dot(q, tl.trans(k), UPCAST, DOT_PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
        is_visible = (pos[None, :] <= q_pos[:, None]) & pos_mask[None, :]
        scores = tl.where(is_visible, scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, 1))  # finite: position 0 (first tile) is visible to every row
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, UPCAST, DOT_PRECISION)
        m = m_new

    out = acc / l[:, None]
    out_offsets = token[:, None] * stride_out_token + head * stride_out_head + d[None, :]
    tl.store(
        out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & d_mask[None, :]
    )


IS_INTERPRETED = isinstance(decode_kernel, InterpretedFunction)  # imported under TRITON_INTERPRET=1
