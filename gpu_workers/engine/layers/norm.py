"""RMSNorm matching Hugging Face Llama numerics (variance in fp32, weight applied in the input dtype)."""

from __future__ import annotations

import torch
from torch import nn

from gpu_workers.engine.layers.pointwise import rms_norm


class RMSNorm(nn.Module):
    """y = weight * (x / sqrt(mean(x^2) + eps)), normalised in fp32."""

    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype, device=device), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [num_tokens, hidden] -> same shape and dtype.

        F.rms_norm on the fp32 upcast is x32 * rsqrt(mean(x32^2) + eps) in one fused kernel (HF's formula).
        """
        return rms_norm(x, self.weight, self.eps)
