"""Linear projections with merged weights (qkv, gate_up) and the column slice of each sub-projection."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


def can_pack_linear(dtype: torch.dtype, device: torch.device) -> bool:
    """True when oneDNN can run linears on pre-packed (blocked) weights here: CPU, fp32, or bf16 with native
    support. Whether packing pays is measured (kernel_plan's linear_weights op)."""
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


LINEAR_WEIGHTS_OP = "linear_weights"
LINEAR_WEIGHTS_FORMS = ("plain", "packed")
# the products a packing choice is measured on: a decode batch and a prefill chunk of rows
LINEAR_WEIGHTS_TUNING_ROWS = (16, 512)


def linear_weights_candidates(
    forms: tuple[str, ...], out_features: int, in_features: int, dtype: torch.dtype
) -> dict[str, Callable[[], object]]:
    """The forms of the model's weights for gpu_workers/engine/kernel_tuner.py, each timed on a decode batch and
    a prefill chunk of this shape (LINEAR_WEIGHTS_TUNING_ROWS): "plain" (F.linear on the dense weight) and
    "packed" (packed_linear on the oneDNN-packed weight). On an AMD EPYC without AVX-512 (fp32) packed was
    ~1.3x faster at 16 rows; on avx512_bf16 CPUs packed bf16 is the fast path."""
    generator = torch.Generator().manual_seed(0)
    rows = [torch.randn(n, in_features, generator=generator).to(dtype) for n in LINEAR_WEIGHTS_TUNING_ROWS]
    weight = torch.randn(out_features, in_features, generator=generator).to(dtype)
    packed = pack_linear_weight(weight) if "packed" in forms else weight
    all_forms: dict[str, Callable[[], object]] = {
        "plain": lambda: [F.linear(x, weight) for x in rows],
        "packed": lambda: [packed_linear(x, packed) for x in rows],
    }
    return {form: all_forms[form] for form in forms}


PREFILL_GEMM_OP = "prefill_gemm"
PREFILL_GEMM_FORMS = ("packed", "fp32_upcast", "plain")


def prefill_gemm_candidates(
    forms: tuple[str, ...], out_features: int, in_features: int, dtype: torch.dtype, num_rows: int
) -> dict[str, Callable[[], torch.Tensor]]:
    """The forms of a prefill-sized product of a packed `dtype` model, on random data of this shape, for
    gpu_workers/engine/kernel_tuner.py: "packed" (packed_linear on the oneDNN-packed weight; the simplest, listed
    first), "fp32_upcast" (MergedLinear's wide path: fp32 upcasts of activations and weight, the output rounded
    back) and "plain" (F.linear on the dense weight in `dtype`). Which is faster depends on the CPU: on
    avx512_bf16 CPUs without AMX fp32 was ~1.6x faster on an Intel, packed ~2.3x faster on an AMD EPYC
    (2 threads, 512 rows)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(num_rows, in_features, generator=generator).to(dtype)
    weight = torch.randn(out_features, in_features, generator=generator).to(dtype)
    packed = pack_linear_weight(weight)
    all_forms: dict[str, Callable[[], torch.Tensor]] = {
        "packed": lambda: packed_linear(x, packed),
        "fp32_upcast": lambda: F.linear(x.float(), weight.float()).to(dtype),
        "plain": lambda: F.linear(x, weight),
    }
    return {form: all_forms[form] for form in forms}


# Rows from which a product is prefill-sized: it may go through the wide (fp32) path where the tuner chose it
# (on an Intel avx512_bf16 CPU without AMX the crossover was ~64 rows; 1.35x faster at 128, 1.6x at 512).
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
        self.weight = nn.Parameter(
            torch.empty(offset, in_features, dtype=dtype, device=device), requires_grad=False
        )
        self.bias = (
            nn.Parameter(torch.zeros(offset, dtype=dtype, device=device), requires_grad=False)
            if has_bias
            else None
        )
        self.packed_weight: torch.Tensor | None = None
        self.row_norms_sq: torch.Tensor | None = None  # fp32 [out]: ||W||^2 per row, kept when W is dropped
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

        wide_dtype (float32 for a bf16 model where the kernel tuner chose fp32 upcasts, the model dtype where it
        chose the plain dense product, see prefill_gemm_candidates): the dense weight is kept too, and products
        of at least WIDE_GEMM_MIN_ROWS rows (prefill) multiply the activations and the weight in wide_dtype
        (exact upcasts), rounding the output back to the model dtype; smaller ones (decode) stay on the packed
        weight. Without it the dense weight is dropped.
        """
        self.packed_weight = pack_linear_weight(self.weight.data)
        self.row_norms_sq = self.weight.data.float().pow(2).sum(dim=1)
        if wide_dtype is not None:
            self.wide_dtype = wide_dtype
            self.wide_bias = self.bias.data.to(wide_dtype) if self.bias is not None else None
        else:
            self.weight.data = torch.empty(0, dtype=self.weight.dtype, device=self.weight.device)

    def delta_row_norms(
        self, col_start: int, col_end: int, lora_a: torch.Tensor, b_scaled: torch.Tensor
    ) -> torch.Tensor:
        """||W[c0:c1] + b_scaled @ lora_a||_2 per output row, fp32 [c1 - c0] (DoRA's weight norm, as peft computes
        it at inference; layers/dora.py). lora_a: [r, in]; b_scaled: [c1 - c0, r] (the LoRA scale folded in).

        With the dense weight: exactly peft's sum. With only the packed weight (dropped after `pack`): the same
        norm expanded, ||W||^2 + 2 (W A^T) . B + ||B A||^2 per row, W A^T through the packed product.
        """
        lora_a = lora_a.to(self.weight.device).float()
        b_scaled = b_scaled.to(self.weight.device).float()
        if self.weight.numel() > 0:
            return torch.linalg.norm(self.weight[col_start:col_end].float() + b_scaled @ lora_a, dim=1)
        assert self.packed_weight is not None and self.row_norms_sq is not None
        wa = packed_linear(lora_a.to(self.weight.dtype), self.packed_weight).float()[:, col_start:col_end]
        ba_sq = ((b_scaled @ (lora_a @ lora_a.t())) * b_scaled).sum(dim=1)  # ||(B A)_row||^2, [c1 - c0]
        sq = self.row_norms_sq[col_start:col_end] + 2 * (b_scaled * wa.t()).sum(dim=1) + ba_sq
        return sq.clamp_min(0).sqrt()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [num_tokens, in_features] -> [num_tokens, sum(output_sizes)]."""
        if self.packed_weight is None:
            return F.linear(x, self.weight, self.bias)
        if self.wide_dtype is not None and x.shape[0] >= WIDE_GEMM_MIN_ROWS:
            wide = self.wide_dtype
            return F.linear(x.to(wide), self.weight.to(wide), self.wide_bias).to(x.dtype)
        return packed_linear(x, self.packed_weight, self.bias)
