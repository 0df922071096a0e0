"""Rotary position embeddings (default, linear and llama3 scaling), HF rotate_half convention."""

from __future__ import annotations

import math
from typing import Any

import torch


def rope_parameters(hf_config: dict[str, Any]) -> dict[str, Any]:
    """Normalise rope settings from a HF config dict (transformers 4.x rope_scaling or 5.x rope_parameters)."""
    params = dict(hf_config.get("rope_parameters") or {})
    scaling = hf_config.get("rope_scaling") or {}
    params.update({k: v for k, v in scaling.items() if k not in params})
    params.setdefault("rope_theta", hf_config.get("rope_theta", 10000.0))
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    return params


def inverse_frequencies(head_dim: int, params: dict[str, Any]) -> torch.Tensor:
    """inv_freq [head_dim // 2] in fp32 for the configured rope type."""
    base = float(params["rope_theta"])
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    rope_type = params["rope_type"]
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(params["factor"])
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, params)
    raise ValueError(f"unsupported rope_type {rope_type!r}; supported: default, linear, llama3")


def _llama3_inv_freq(inv_freq: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1 frequency-dependent scaling (same formula as transformers)."""
    factor = float(params["factor"])
    low_freq_factor = float(params["low_freq_factor"])
    high_freq_factor = float(params["high_freq_factor"])
    old_context_len = float(params["original_max_position_embeddings"])
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding:
    """Precomputed cos and "rotated sin" tables [max_positions, head_dim] in the compute dtype.

    sin_rotated is sin with its first half negated, so that rotate_half(x) * sin == x.roll(half) * sin_rotated
    elementwise (negating a factor commutes exactly with the product): one roll instead of slice-negate-cat.
    """

    def __init__(
        self,
        head_dim: int,
        max_positions: int,
        params: dict[str, Any],
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        inv_freq = inverse_frequencies(head_dim, params)
        positions = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)  # [max_positions, head_dim // 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [max_positions, head_dim]
        half = head_dim // 2
        sin = emb.sin()
        self.cos = emb.cos().to(dtype=dtype, device=device)
        self.sin_rotated = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1).to(dtype=dtype, device=device)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin_rotated for positions [num_tokens] -> each [num_tokens, 1, head_dim] (broadcast over heads)."""
        return (
            self.cos.index_select(0, positions).unsqueeze(1),
            self.sin_rotated.index_select(0, positions).unsqueeze(1),
        )


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin_rotated: torch.Tensor) -> torch.Tensor:
    """x: [num_tokens, num_heads, head_dim] -> x * cos + rotate_half(x) * sin (HF rotate_half convention, the
    same products and sums), with rotate_half(x) * sin computed as x.roll(half) * sin_rotated."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin_rotated
