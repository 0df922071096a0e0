"""Paged attention in Triton, reading K/V from the engine's page pool in place (no gather, no padding to the
longest sequence): decode (one query token per sequence, GQA, optionally split over the context) and varlen
prefill (every prefill chunk of a step in one launch, causal, earlier cached tokens read from their pages).

Runs on CUDA (the forms "triton" of gpu_workers/engine/layers/attention.py); the parity tests run the same
kernels on the CPU under Triton's interpreter (TRITON_INTERPRET=1 before triton itself is imported: triton
decides at decoration time, its own standard library included). Importing this module needs triton:
gpu_workers/engine/layers/attention.py imports it only when a triton form runs.

Page pool (gpu_workers/engine/layers/attention.py): k_cache, v_cache [num_slots, num_kv_heads, head_dim], slot =
page * block_size + offset; a sequence's position p lives in slot block_table[p // block_size] * block_size +
p % block_size. Only positions below a sequence's length are loaded: padding pages in a block table and the
unused slots of a page are never read, whatever they hold.

Softmax: online (flash) softmax in fp32 in base 2 (scores scaled by scale * log2(e)); products of bf16/fp16
inputs accumulate in fp32, fp32 inputs multiply in full fp32 (no TF32). Under the interpreter, bf16 products
take fp32 upcasts of their (bf16-rounded) operands: the interpreter stores bf16 as uint16 and its tl.dot would
multiply the bit patterns (triton-lang/triton#11584, "not supported yet"); a bf16 x bf16 product is exact in
fp32, so only the summation order differs from the GPU's MMA.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

LOG2_E = 1.4426950408889634
MIN_DOT_ROWS = 16  # tl.dot needs blocks of >= 16 along every dimension on the GPU
DEFAULT_BLOCK_N = 64  # context positions per tile
DEFAULT_BLOCK_M = 32  # prefill query rows per program
# Split-K for decode: split a sequence's context only when the batch leaves the GPU's SMs idle, never into
# pieces shorter than MIN_SPLIT_TOKENS, at most MAX_NUM_SPLITS ways.
TARGET_DECODE_PROGRAMS = 256
MIN_SPLIT_TOKENS = 256
MAX_NUM_SPLITS = 16


@triton.jit
def _dot(a, b, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """a @ b in fp32 (UPCAST: on fp32 copies of a and b)."""
    if UPCAST:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        out = tl.dot(a, b, input_precision=DOT_PRECISION)
    return out


@triton.jit
def _decode_kernel(
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
def _merge_splits_kernel(
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
def _prefill_kernel(
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


IS_INTERPRETED = isinstance(_decode_kernel, InterpretedFunction)  # imported under TRITON_INTERPRET=1


def _block_d(head_dim: int) -> int:
    return max(MIN_DOT_ROWS, triton.next_power_of_2(head_dim))


def _dot_precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"  # "tf32" only matters for fp32 inputs


def _check_pool(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride():
        raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must match")
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1:
        raise ValueError("q and the KV cache need a contiguous last (head_dim) dimension")
    if q.shape[1] % k_cache.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads are not a multiple of {k_cache.shape[1]} kv heads")


def decode_num_splits(num_seqs: int, num_kv_heads: int, max_context: int) -> int:
    """Splits per sequence: enough programs to fill the GPU when the batch alone cannot, each split at least
    MIN_SPLIT_TOKENS of the longest context, at most MAX_NUM_SPLITS. From shapes only (no device sync), so a
    captured step keeps it."""
    wanted = math.ceil(TARGET_DECODE_PROGRAMS / max(1, num_seqs * num_kv_heads))
    return max(1, min(wanted, max_context // MIN_SPLIT_TOKENS, MAX_NUM_SPLITS))


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    scale: float,
    num_splits: int | None = None,
    block_n: int = DEFAULT_BLOCK_N,
) -> torch.Tensor:
    """Attention of one query token per sequence over its pages in place -> [num_seqs, num_heads, head_dim].

    q: [num_seqs, num_heads, head_dim]; k_cache, v_cache: [num_slots, num_kv_heads, head_dim];
    block_tables: [num_seqs, max_blocks] page ids (entries past a sequence's length are never read);
    seq_lens: [num_seqs] context length of each sequence (>= 1, including the query token's own K/V, already
    in the pool). num_splits: split each context this many ways (None: decode_num_splits).
    """
    _check_pool(q, k_cache, v_cache)
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    group = num_heads // num_kv_heads
    if num_splits is None:
        num_splits = decode_num_splits(num_seqs, num_kv_heads, block_tables.shape[1] * block_size)
    block_d = _block_d(head_dim)
    out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    if num_splits > 1:  # [num_seqs, num_heads, num_splits, block_d] partial outputs, their log2-sum-exps
        part_out = torch.empty(num_seqs, num_heads, num_splits, block_d, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = out  # not read or written
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        out,
        part_out,
        part_lse,
        scale * LOG2_E,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        NUM_Q_PER_KV=group,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        NUM_SPLITS=num_splits,
        BLOCK_H=max(MIN_DOT_ROWS, triton.next_power_of_2(group)),
        BLOCK_N=max(MIN_DOT_ROWS, block_n),
        BLOCK_D=block_d,
        DOT_PRECISION=_dot_precision(q.dtype),
        UPCAST=IS_INTERPRETED and q.dtype == torch.bfloat16,
    )
    if num_splits > 1:
        _merge_splits_kernel[(num_seqs, num_heads)](
            part_out,
            part_lse,
            out,
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            NUM_SPLITS=num_splits,
            BLOCK_S=triton.next_power_of_2(num_splits),
            BLOCK_D=block_d,
        )
    return out


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    q_starts: torch.Tensor,
    q_lens: torch.Tensor,
    context_lens: torch.Tensor,
    max_q_len: int,
    block_size: int,
    scale: float,
    out: torch.Tensor | None = None,
    block_m: int = DEFAULT_BLOCK_M,
    block_n: int = DEFAULT_BLOCK_N,
) -> torch.Tensor:
    """Causal attention of packed prefill chunks of different lengths, K/V read from the pages in place.

    q: [num_tokens, num_heads, head_dim], the step's queries; chunk i is rows [q_starts[i], q_starts[i] +
    q_lens[i]), positions [context_lens[i] - q_lens[i], context_lens[i]) of its sequence, whose K/V (cached
    prefix and this chunk's own tokens) are in the pages of block_tables[i] ([num_chunks, max_blocks]).
    max_q_len: the longest chunk (host int: the launch grid). Writes those rows of `out` (a new tensor like q
    when None; other rows are left as they are) and returns it.
    """
    _check_pool(q, k_cache, v_cache)
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_chunks = q_lens.shape[0]
    out = torch.empty_like(q) if out is None else out
    if num_chunks == 0 or max_q_len == 0:
        return out
    block_m = max(MIN_DOT_ROWS, block_m)
    _prefill_kernel[(num_chunks, num_heads, triton.cdiv(max_q_len, block_m))](
        q,
        k_cache,
        v_cache,
        block_tables,
        q_starts,
        q_lens,
        context_lens,
        out,
        scale * LOG2_E,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        NUM_Q_PER_KV=num_heads // k_cache.shape[1],
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_M=block_m,
        BLOCK_N=max(MIN_DOT_ROWS, block_n),
        BLOCK_D=_block_d(head_dim),
        DOT_PRECISION=_dot_precision(q.dtype),
        UPCAST=IS_INTERPRETED and q.dtype == torch.bfloat16,
    )
    return out
