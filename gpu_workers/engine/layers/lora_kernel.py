"""Segmented LoRA delta on CPU with a small C/OpenMP kernel (lora_kernel.c), for decode-sized segments.

Torch has no segmented matmul: a decode step's LoRA costs either one tiny matmul per (adapter, projection)
(hundreds of calls, each dominated by dispatch) or the stacked form (layers/stacked_lora.py: every token
times every adapter, then a mask), which multiplies 16 tokens by 16 adapters to use 1/16 of the products. The kernel
reads each adapter's A and B once per block of its tokens and multiplies only its own tokens: a decode step's
LoRA becomes memory-bound on the adapters' bytes, with one call per (layer, projection).

layers/cpu_kernels.py compiles the C source at engine start. Without a C compiler (or on a GPU) the engine
keeps the torch forms. Numerics: fp32 accumulation; x @ A is rounded to the model dtype (as a matmul's output
would be), and each output element is rounded once after adding its delta (as addmm_ does).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch

from gpu_workers.engine.layers.cpu_kernels import load_cpu_kernels
from gpu_workers.engine.layers.lora import PROJECTIONS, LoraAdapter, LoraSegment
from gpu_workers.engine.layers.lora_descriptors import DESC_STRIDE, PROJECTION_INDEX

# Segments of at most this many tokens go through the kernel; longer ones (prefill) through GEMMs.
MAX_KERNEL_SEGMENT_TOKENS = 16
_KERNEL_DTYPES = {torch.bfloat16: "lora_delta_bf16", torch.float32: "lora_delta_f32"}


def is_kernel_usable(device: torch.device, dtype: torch.dtype) -> bool:
    """True when the kernel serves this device and dtype (CPU, bf16 or fp32) and it could be built."""
    return device.type == "cpu" and dtype in _KERNEL_DTYPES and load_cpu_kernels() is not None


@dataclass(frozen=True)
class KernelLora:
    """Kernel descriptors of an ordered set of adapters (holds them, so their tensors stay alive).

    desc: [num_adapters, num_layers, len(PROJECTIONS), DESC_STRIDE] int64; order: [num_adapters] positions,
    largest adapter first (the kernel's threads take them in this order).
    """

    adapters: tuple[LoraAdapter, ...]
    desc: torch.Tensor
    order: torch.Tensor

    def desc_address(self, layer_idx: int, projection: str) -> int:
        """Address of adapter 0's descriptor for (layer, projection); adapter p's is p * desc.stride(0) further."""
        offset = (layer_idx * len(PROJECTIONS) + PROJECTION_INDEX[projection]) * DESC_STRIDE
        return self.desc.data_ptr() + offset * self.desc.element_size()


def build_kernel_lora(adapters: tuple[LoraAdapter, ...], descriptors: list[torch.Tensor]) -> KernelLora:
    """KernelLora of `adapters` from their `adapter_descriptors`."""
    order = sorted(range(len(adapters)), key=lambda p: -adapters[p].rank)
    return KernelLora(adapters, torch.stack(descriptors).contiguous(), torch.tensor(order, dtype=torch.int64))


@dataclass(frozen=True)
class KernelStep:
    """One step's segments served by the kernel: segments[i] are the rows of kernel.adapters[i] (possibly
    empty); seg_table is the same as a [num_adapters, 2] int64 tensor."""

    kernel: KernelLora
    segments: tuple[tuple[int, int], ...]
    seg_table: torch.Tensor

    @classmethod
    def of(cls, kernel: KernelLora, segments: tuple[LoraSegment, ...]) -> KernelStep:
        """The step over `segments` (segment i uses kernel.adapters[i])."""
        ranges = tuple((seg.start, seg.end) for seg in segments)
        return cls(kernel, ranges, torch.tensor(ranges, dtype=torch.int64).reshape(-1, 2))

    def select_rows(self, row_list: list[int]) -> KernelStep:
        """The same adapters over batch rows `row_list` (ascending), renumbered (row i = row_list[i])."""
        ranges = tuple(
            (bisect.bisect_left(row_list, s), bisect.bisect_left(row_list, e)) for s, e in self.segments
        )
        return KernelStep(self.kernel, ranges, torch.tensor(ranges, dtype=torch.int64).reshape(-1, 2))

    def begin_layer(self, layer_idx: int) -> None:
        """Nothing changes between layers."""

    def add_delta(self, out: torch.Tensor, x: torch.Tensor, layer_idx: int, projection: str) -> None:
        """out[seg] += x[seg] @ A @ B for every adapter over its rows, in one kernel call.

        out: [num_tokens, out_features] (rows contiguous, updated in place); x: [num_tokens, in_features].
        """
        lib = load_cpu_kernels()
        assert lib is not None and out.stride(1) == 1
        if x.stride(1) != 1:
            x = x.contiguous()
        kernel = self.kernel
        getattr(lib, _KERNEL_DTYPES[out.dtype])(
            x.data_ptr(),
            x.stride(0),
            out.data_ptr(),
            out.stride(0),
            x.shape[1],
            kernel.desc.shape[0],
            kernel.desc_address(layer_idx, projection),
            kernel.desc.stride(0),
            self.seg_table.data_ptr(),
            kernel.order.data_ptr(),
            torch.get_num_threads(),
        )
