"""RMSNorm matching Hugging Face Llama numerics (variance in fp32, weight applied in the input dtype)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


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
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return self.weight * normed.to(x.dtype)
