"""Linear projections with merged weights (qkv, gate_up) and the column slice of each sub-projection."""

from __future__ import annotations

import functools
import time

import torch
import torch.nn.functional as F
from torch import nn

from gpu_workers.layers.cpu_kernels import x86_cpu_flags


def can_pack_linear(dtype: torch.dtype, device: torch.device) -> bool:
    """True when oneDNN can run linears on pre-packed (blocked) weights here: CPU, bf16 with native support.

    Packed weights stream ~1.5x faster at decode batch sizes (memory-bound) and are never slower for prefill.
    """
    if device.type != "cpu" or dtype not in (torch.bfloat16, torch.float32):
        return False
    try:
        return bool(
            torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and (dtype == torch.float32 or torch.ops.mkldnn._is_mkldnn_bf16_supported())
        )
    except (AttributeError, RuntimeError):
        return False


@functools.lru_cache(maxsize=8)
def is_fp32_gemm_faster(dtype: torch.dtype, device_type: str, num_threads: int) -> bool:
    """True when oneDNN's fp32 GEMM beats its packed `dtype` GEMM on a prefill-sized product here, counting
    the upcasts of activations and weight and the output's cast back.

    On x86-64 Linux this is decided by the CPU's flags: without a bf16 matrix unit (AMX) a bf16 dot-product
    instruction (avx512_bf16) does no more multiply-adds per cycle than fp32 FMAs, and oneDNN's bf16 kernels
    reach ~0.55-0.65x of its fp32 ones (measured 1.5-1.6x for the fp32 path at 512 rows, 2 threads); with AMX
    bf16 wins. Elsewhere it is measured once per thread count (best of 5, a clear 1.25x margin); a measurement
    is at the mercy of other load on the machine, the flags are not.
    """
    if device_type != "cpu" or dtype == torch.float32 or not can_pack_linear(dtype, torch.device("cpu")):
        return False
    flags = x86_cpu_flags()
    if flags is not None:
        return dtype == torch.bfloat16 and "amx_bf16" not in flags
    return _measure_fp32_gemm_faster(dtype)


def _measure_fp32_gemm_faster(dtype: torch.dtype) -> bool:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4 * WIDE_GEMM_MIN_ROWS, 1024, generator=generator).to(dtype)
    weight = torch.randn(2048, 1024, generator=generator).to(dtype)
    packed = pack_linear_weight(weight)
    native_s = wide_s = float("inf")
    with torch.inference_mode():
        packed_linear(x, packed)
        F.linear(x.float(), weight.float()).to(dtype)
        for _ in range(5):  # interleaved, best of 5: load from other processes hits both alike
            start = time.perf_counter()
            packed_linear(x, packed)
            native_s = min(native_s, time.perf_counter() - start)
            start = time.perf_counter()
            F.linear(x.float(), weight.float()).to(dtype)  # as MergedLinear's wide path
            wide_s = min(wide_s, time.perf_counter() - start)
    return wide_s * _FP32_GEMM_MARGIN < native_s


_FP32_GEMM_MARGIN = 1.25
# Rows from which a wide (fp32) product beats the packed bf16 one despite upcasting the weight per call
# (measured crossover ~64 rows on avx512_bf16 without AMX; 1.35x faster at 128, 1.6x at 512).
WIDE_GEMM_MIN_ROWS = 128


def pack_linear_weight(weight: torch.Tensor) -> torch.Tensor:
    """weight [out, in] (dense) -> oneDNN blocked weight for `packed_linear`."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous())


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x W^T (+ b) with W from `pack_linear_weight`; x: [n, in] -> [n, out] (same values as F.linear)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class MergedLinear(nn.Module):
    """y = x W^T (+ b) where W stacks several HF projections along the output dim.

    `output_slices[name] = (start, end)` says which output columns belong to which HF module, so a LoRA
    delta for e.g. k_proj is added into columns [start, end).
    """

    def __init__(
        self,
        in_features: int,
        output_sizes: dict[str, int],
        has_bias: bool,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__()
        self.output_slices: dict[str, tuple[int, int]] = {}
        offset = 0
        for name, size in output_sizes.items():
            self.output_slices[name] = (offset, offset + size)
            offset += size
        self.weight = nn.Parameter(torch.empty(offset, in_features, dtype=dtype, device=device), requires_grad=False)
        self.bias = (
            nn.Parameter(torch.zeros(offset, dtype=dtype, device=device), requires_grad=False) if has_bias else None
        )
        self.packed_weight: torch.Tensor | None = None
        self.wide_dtype: torch.dtype | None = None  # large products in this wider dtype (see pack)
        self.wide_bias: torch.Tensor | None = None

    def load(self, name: str, tensor: torch.Tensor, is_bias: bool = False) -> None:
        """Copy one HF module's weight (or bias) into its slice."""
        start, end = self.output_slices[name]
        target = self.bias if is_bias else self.weight
        if target is None:
            raise ValueError(f"{name}: checkpoint has a bias but the model config says it has none")
        target.data[start:end].copy_(tensor)

    def pack(self, wide_dtype: torch.dtype | None = None) -> None:
        """Run on a oneDNN-packed copy of the weight (call once, after loading; see can_pack_linear).

        wide_dtype (float32 for a bf16 model, see is_fp32_gemm_faster): the dense weight is kept too, and
        products of at least WIDE_GEMM_MIN_ROWS rows (prefill) multiply exact upcasts of the activations and
        of the weight in wide_dtype, rounding the output back to the model dtype; smaller ones (decode) stay
        on the packed weight. Without it the dense weight is dropped.
        """
        self.packed_weight = pack_linear_weight(self.weight.data)
        if wide_dtype is not None and wide_dtype != self.weight.dtype:
            self.wide_dtype = wide_dtype
            self.wide_bias = self.bias.data.to(wide_dtype) if self.bias is not None else None
        else:
            self.weight.data = torch.empty(0, dtype=self.weight.dtype, device=self.weight.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [num_tokens, in_features] -> [num_tokens, sum(output_sizes)]."""
        if self.packed_weight is None:
            return F.linear(x, self.weight, self.bias)
        if self.wide_dtype is not None and x.shape[0] >= WIDE_GEMM_MIN_ROWS:
            wide = self.wide_dtype
            return F.linear(x.to(wide), self.weight.to(wide), self.wide_bias).to(x.dtype)
        return packed_linear(x, self.packed_weight, self.bias)
