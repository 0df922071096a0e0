"""Linear projections with merged weights (qkv, gate_up) and the column slice of each sub-projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


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

    def load(self, name: str, tensor: torch.Tensor, is_bias: bool = False) -> None:
        """Copy one HF module's weight (or bias) into its slice."""
        start, end = self.output_slices[name]
        target = self.bias if is_bias else self.weight
        if target is None:
            raise ValueError(f"{name}: checkpoint has a bias but the model config says it has none")
        target.data[start:end].copy_(tensor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [num_tokens, in_features] -> [num_tokens, sum(output_sizes)]."""
        return F.linear(x, self.weight, self.bias)
