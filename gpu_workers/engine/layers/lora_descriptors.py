"""Where an adapter's LoRA tensors are, as rows of int64 that the LoRA kernels read: the C/OpenMP CPU kernel
(lora_kernel.c, layers/lora_kernel.py) and the Triton kernels (layers/triton_lora_kernels.py).

One row per (adapter, layer, merged projection), DESC_STRIDE int64 long:
    a_ptr, a_row_stride, rank_cols, num_parts, then per part (r0, r1, c0, c1, b_ptr, b_row_stride)
A^T: [in_features, rank_cols] rows of stride a_row_stride (the projection's `a_t`: every targeted sub-module's
rank columns, concatenated); part p's B^T: [r1 - r0, c1 - c0] rows of stride b_row_stride (scale folded), added
into output columns [c0, c1) from rank columns [r0, r1). An all-zero row (rank_cols == 0): the adapter does not
target this projection. The kernels read the tensors where they are (device adapters may be views into the KV
pages, gpu_workers/engine/adapter_layout.py): nothing is copied or padded to a largest rank.
"""

from __future__ import annotations

import torch

from gpu_workers.engine.layers.lora import PROJECTIONS, LoraAdapter

MAX_PARTS = 3  # = MAX_PARTS in lora_kernel.c (q, k, v)
DESC_STRIDE = 4 + 6 * MAX_PARTS
MAX_RANK_COLS = 3072  # = MAX_RANK_COLS in lora_kernel.c
PROJECTION_INDEX = {name: i for i, name in enumerate(PROJECTIONS)}


def adapter_descriptors(adapter: LoraAdapter) -> torch.Tensor | None:
    """[num_layers, len(PROJECTIONS), DESC_STRIDE] int64 descriptors of one adapter's tensors, or None when a
    tensor's layout does not fit the kernels (rows not contiguous, too many rank columns)."""
    num_layers = len(adapter.layers)
    desc = torch.zeros(num_layers, len(PROJECTIONS), DESC_STRIDE, dtype=torch.int64)
    for layer_idx, layer in enumerate(adapter.layers):
        for name, proj in layer.items():
            a = proj.a_t
            if a.stride(1) != 1 or a.shape[1] > MAX_RANK_COLS or len(proj.parts) > MAX_PARTS:
                return None
            row = [a.data_ptr(), a.stride(0), a.shape[1], len(proj.parts)]
            for r0, r1, c0, c1, b_t in proj.parts:
                if b_t.stride(1) != 1:
                    return None
                row += [r0, r1, c0, c1, b_t.data_ptr(), b_t.stride(0)]
            desc[layer_idx, PROJECTION_INDEX[name], : len(row)] = torch.tensor(row, dtype=torch.int64)
    return desc
