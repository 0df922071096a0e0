"""The Triton bodies of the grouped LoRA kernels (Punica's SGMV and BGMV), shrink then expand; launched by
layers/triton_lora.py, which is the only module that imports this one (triton is imported here, never by the
engine at start).

Every kernel reads an adapter's tensors through its descriptor row (layers/lora_descriptors.py): `desc_ptr`
points at adapter 0's row for one (layer, projection), adapter p's row is p * desc_stride further. The rank is
a loop bound or an early exit, never a padded shape: a program whose rank block lies past its adapter's rank
columns returns at once, and the expand loops over exactly its adapter's rank.

- shrink: h[row, :rank_cols] = x[row] @ A^T (fp32 accumulation, fp32 h);
- expand: out[row, c0:c1] += scale * round(h[row, r0:r1]) @ B^T, per part (q/k/v, gate/up), where round() is
  the model dtype (as the torch forms' x @ A output) and each output element is rounded once.

SGMV programs take BLOCK_M rows of one segment (seg_ptr: [num_segments, 3] int32 start, end, adapter position)
and multiply tiles with tl.dot; BGMV programs take one row (row_adapter_ptr: [num_rows] int32 adapter
position, -1: none) and multiply-add elementwise in fp32 (a GEMV: decode rows). UPCAST (the interpreter,
which multiplies bf16 bit patterns as integers) converts every loaded tile to fp32 before it is used.

Under TRITON_INTERPRET=1 (set before triton is imported: Triton decides then for its own library too) the
kernels are Triton's interpreter running on CPU tensors, a test tool (`IS_INTERPRETED`).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction


@triton.jit
def sgmv_shrink(
    x_ptr,
    x_stride,
    h_ptr,
    h_stride,
    seg_ptr,
    desc_ptr,
    desc_stride,
    in_features,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """SGMV shrink: h[rows of a segment, its adapter's rank columns] = x @ A^T, one tile per program."""
    # grid: (num_segments, cdiv(max segment rows, BLOCK_M), cdiv(max rank_cols, BLOCK_R))
    seg = tl.program_id(0)
    start = tl.load(seg_ptr + seg * 3)
    end = tl.load(seg_ptr + seg * 3 + 1)
    pos = tl.load(seg_ptr + seg * 3 + 2)
    row0 = start + tl.program_id(1) * BLOCK_M
    if (pos < 0) | (row0 >= end):
        return
    desc = desc_ptr + pos.to(tl.int64) * desc_stride
    rank_cols = tl.load(desc + 2)
    col0 = tl.program_id(2) * BLOCK_R
    if col0 >= rank_cols:
        return
    a_ptr = tl.load(desc).to(tl.pointer_type(x_ptr.dtype.element_ty))
    a_stride = tl.load(desc + 1)
    rows = (row0 + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = col0 + tl.arange(0, BLOCK_R)
    row_mask = rows < end
    col_mask = cols < rank_cols
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for k0 in range(0, in_features, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_mask = ks < in_features
        x = tl.load(
            x_ptr + rows[:, None] * x_stride + ks[None, :],
            mask=row_mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        a = tl.load(
            a_ptr + ks[:, None].to(tl.int64) * a_stride + cols[None, :],
            mask=k_mask[:, None] & col_mask[None, :],
            other=0.0,
        )
        if UPCAST:
            x = x.to(tl.float32)
            a = a.to(tl.float32)
        acc = tl.dot(x, a, acc, input_precision=PRECISION)  # [BLOCK_M, BLOCK_R]
    tl.store(
        h_ptr + rows[:, None] * h_stride + cols[None, :], acc, mask=row_mask[:, None] & col_mask[None, :]
    )


@triton.jit
def _expand_part(part_desc, col_block, out_ptr, BLOCK_N: tl.constexpr):
    """One output part of an adapter for an expand program (its descriptor at `part_desc`): the part's first
    rank column and rank, its first and end output columns, this program's first output column, B's pointer
    and row stride (B in the dtype of out_ptr)."""
    r0 = tl.load(part_desc)
    c0 = tl.load(part_desc + 2)
    b_ptr = tl.load(part_desc + 4).to(tl.pointer_type(out_ptr.dtype.element_ty))
    rank, c1, b_stride = tl.load(part_desc + 1) - r0, tl.load(part_desc + 3), tl.load(part_desc + 5)
    return r0, rank, c0, c1, c0 + col_block * BLOCK_N, b_ptr, b_stride


@triton.jit
def sgmv_expand(
    h_ptr,
    h_stride,
    out_ptr,
    out_stride,
    seg_ptr,
    desc_ptr,
    desc_stride,
    scales_ptr,
    num_col_blocks,
    HAS_SCALE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """SGMV expand: out[rows of a segment, a part's columns] += scale * h @ B^T, one tile per program."""
    # grid: (num_segments, cdiv(max segment rows, BLOCK_M), max parts * num_col_blocks)
    seg = tl.program_id(0)
    start = tl.load(seg_ptr + seg * 3)
    end = tl.load(seg_ptr + seg * 3 + 1)
    pos = tl.load(seg_ptr + seg * 3 + 2)
    row0 = start + tl.program_id(1) * BLOCK_M
    if (pos < 0) | (row0 >= end):
        return
    desc = desc_ptr + pos.to(tl.int64) * desc_stride
    part = tl.program_id(2) // num_col_blocks
    if part >= tl.load(desc + 3):
        return
    r0, rank, c0, c1, col0, b_ptr, b_stride = _expand_part(
        desc + 4 + part * 6, tl.program_id(2) % num_col_blocks, out_ptr, BLOCK_N
    )
    if col0 >= c1:
        return
    dtype = out_ptr.dtype.element_ty
    rows = (row0 + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = col0 + tl.arange(0, BLOCK_N)
    row_mask = rows < end
    col_mask = cols < c1
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, rank, BLOCK_R):  # this adapter's rank, not the launch's largest
        ks = k0 + tl.arange(0, BLOCK_R)
        k_mask = ks < rank
        h_ptrs = h_ptr + rows[:, None] * h_stride + (r0 + ks)[None, :]
        h = tl.load(h_ptrs, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        h = h.to(dtype)  # rounded as the torch forms' x @ A output
        b = tl.load(
            b_ptr + ks[:, None].to(tl.int64) * b_stride + (cols - c0)[None, :],
            mask=k_mask[:, None] & col_mask[None, :],
            other=0.0,
        )
        if UPCAST:
            h = h.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(h, b, acc, input_precision=PRECISION)  # [BLOCK_M, BLOCK_N]
    if HAS_SCALE:
        acc = acc * tl.load(scales_ptr + pos)
    out_ptrs = out_ptr + rows[:, None] * out_stride + cols[None, :]
    mask = row_mask[:, None] & col_mask[None, :]
    tl.store(out_ptrs, (tl.load(out_ptrs, mask=mask).to(tl.float32) + acc).to(dtype), mask=mask)


@triton.jit
def bgmv_shrink(
    x_ptr,
    x_stride,
    h_ptr,
    h_stride,
    row_adapter_ptr,
    desc_ptr,
    desc_stride,
    in_features,
    BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """BGMV shrink: h[row, its adapter's rank columns] = x[row] @ A^T, one row per program."""
    # grid: (num_rows, cdiv(max rank_cols, BLOCK_R))
    row = tl.program_id(0).to(tl.int64)
    pos = tl.load(row_adapter_ptr + row)
    if pos < 0:
        return
    desc = desc_ptr + pos.to(tl.int64) * desc_stride
    rank_cols = tl.load(desc + 2)
    col0 = tl.program_id(1) * BLOCK_R
    if col0 >= rank_cols:
        return
    a_ptr = tl.load(desc).to(tl.pointer_type(x_ptr.dtype.element_ty))
    a_stride = tl.load(desc + 1)
    cols = col0 + tl.arange(0, BLOCK_R)
    col_mask = cols < rank_cols
    acc = tl.zeros((BLOCK_K, BLOCK_R), dtype=tl.float32)
    for k0 in range(0, in_features, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_mask = ks < in_features
        x = tl.load(x_ptr + row * x_stride + ks, mask=k_mask, other=0.0).to(tl.float32)  # [BLOCK_K]
        a = tl.load(
            a_ptr + ks[:, None].to(tl.int64) * a_stride + cols[None, :],
            mask=k_mask[:, None] & col_mask[None, :],
            other=0.0,
        ).to(tl.float32)
        acc += x[:, None] * a
    tl.store(h_ptr + row * h_stride + cols, tl.sum(acc, axis=0), mask=col_mask)


@triton.jit
def bgmv_expand(
    h_ptr,
    h_stride,
    out_ptr,
    out_stride,
    row_adapter_ptr,
    desc_ptr,
    desc_stride,
    scales_ptr,
    num_col_blocks,
    HAS_SCALE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """BGMV expand: out[row, a part's columns] += scale * h[row] @ B^T, one row per program."""
    # grid: (num_rows, max parts * num_col_blocks)
    row = tl.program_id(0).to(tl.int64)
    pos = tl.load(row_adapter_ptr + row)
    if pos < 0:
        return
    desc = desc_ptr + pos.to(tl.int64) * desc_stride
    part = tl.program_id(1) // num_col_blocks
    if part >= tl.load(desc + 3):
        return
    r0, rank, c0, c1, col0, b_ptr, b_stride = _expand_part(
        desc + 4 + part * 6, tl.program_id(1) % num_col_blocks, out_ptr, BLOCK_N
    )
    if col0 >= c1:
        return
    dtype = out_ptr.dtype.element_ty
    cols = col0 + tl.arange(0, BLOCK_N)
    col_mask = cols < c1
    acc = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, rank, BLOCK_R):  # this adapter's rank, not the launch's largest
        ks = k0 + tl.arange(0, BLOCK_R)
        k_mask = ks < rank
        h = (
            tl.load(h_ptr + row * h_stride + r0 + ks, mask=k_mask, other=0.0).to(dtype).to(tl.float32)
        )  # [BLOCK_R]
        b = tl.load(
            b_ptr + ks[:, None].to(tl.int64) * b_stride + (cols - c0)[None, :],
            mask=k_mask[:, None] & col_mask[None, :],
            other=0.0,
        ).to(tl.float32)
        acc += h[:, None] * b
    delta = tl.sum(acc, axis=0)  # [BLOCK_N]
    if HAS_SCALE:
        delta = delta * tl.load(scales_ptr + pos)
    out_ptrs = out_ptr + row * out_stride + cols
    tl.store(out_ptrs, (tl.load(out_ptrs, mask=col_mask).to(tl.float32) + delta).to(dtype), mask=col_mask)


IS_INTERPRETED = isinstance(sgmv_shrink, InterpretedFunction)
