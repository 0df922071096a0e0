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

from gpu_workers.engine.layers.triton_attention_kernels import (
    IS_INTERPRETED,
    decode_kernel,
    merge_splits_kernel,
    prefill_kernel,
)

LOG2_E = 1.4426950408889634
MIN_DOT_ROWS = 16  # tl.dot needs blocks of >= 16 along every dimension on the GPU
DEFAULT_BLOCK_N = 64  # context positions per tile
DEFAULT_BLOCK_M = 32  # prefill query rows per program
# Split-K for decode: split a sequence's context only when the batch leaves the GPU's SMs idle, never into
# pieces shorter than MIN_SPLIT_TOKENS, at most MAX_NUM_SPLITS ways.
TARGET_DECODE_PROGRAMS = 256
MIN_SPLIT_TOKENS = 256
MAX_NUM_SPLITS = 16


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
    decode_kernel[(num_seqs, num_kv_heads, num_splits)](
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
        merge_splits_kernel[(num_seqs, num_heads)](
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
    prefill_kernel[(num_chunks, num_heads, triton.cdiv(max_q_len, block_m))](
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
