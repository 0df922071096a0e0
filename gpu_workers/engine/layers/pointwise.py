"""The elementwise runs of a decoder layer between its GEMMs, LoRA deltas and attention (RMSNorm, the q/k rotation,
SwiGLU's silu * up), eager or compiled: the kernel tuner's "decode_step" op (gpu_workers/engine/kernel_plan.py).

On a CPU a decode step is mostly small ops, each paying Python and dispatch (issue 35: ~2.3 ms a layer on an AVX2
EPYC); torch.compile (inductor, CPU) fuses each run into one generated kernel. Only these runs are compiled: the
packed oneDNN linears do not lower in inductor, the C kernels are ctypes calls, and a LoRA step's Python objects
would make dynamo guard on (and recompile for) every adapter mix. Whether the fused runs beat eager is measured
per machine and model shape (decode_step_candidates), never assumed. Compiled code is cached on disk by inductor
(its FX graph cache, TORCHINDUCTOR_CACHE_DIR), so a later start mostly re-traces.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gpu_workers.engine.layers.rotary import apply_rotary

DECODE_STEP_OP = "decode_step"
DECODE_STEP_FORMS = ("eager", "compiled")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * (x / sqrt(mean(x^2) + eps)) normalised in fp32 (HF Llama's numerics). x: [num_tokens, hidden]."""
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def rotate_qk(
    qkv: torch.Tensor, cos: torch.Tensor, sin_rotated: torch.Tensor, qk_size: int, head_dim: int
) -> torch.Tensor:
    """The rotated q and k heads of a qkv projection's output qkv: [T, q_size + 2 * kv_size] -> [T, Hq + Hkv, D]
    (q and k are its first qk_size columns, rotated in one pass)."""
    return apply_rotary(qkv[:, :qk_size].view(qkv.shape[0], -1, head_dim), cos, sin_rotated)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU: silu(gate) * up of gate_up: [T, 2 * intermediate] -> [T, intermediate]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate).mul_(up)


@dataclass(frozen=True)
class PointwiseOps:
    """The elementwise runs a decoder layer calls (module doc)."""

    rms_norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    rotate_qk: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, int], torch.Tensor]
    silu_mul: Callable[[torch.Tensor], torch.Tensor]


EAGER_POINTWISE = PointwiseOps(rms_norm, rotate_qk, silu_mul)


def compiled_pointwise() -> PointwiseOps:
    """The same runs through torch.compile (compiled on their first calls; see warm_up)."""
    return PointwiseOps(torch.compile(rms_norm), torch.compile(rotate_qk), torch.compile(silu_mul))


def warm_up(
    ops: PointwiseOps,
    hidden_size: int,
    intermediate_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
) -> float:
    """Call every op on 1, 2 and 3 rows of the model's shapes (dynamo specialises one row, then makes the row count
    dynamic), so the compiles happen here, not in a request's step -> seconds spent."""
    started = time.perf_counter()
    qk_size = (num_heads + num_kv_heads) * head_dim
    rand = lambda *shape: torch.randn(*shape).to(dtype=dtype, device=device)
    with torch.inference_mode():
        for num_rows in (1, 2, 3):
            ops.rms_norm(rand(num_rows, hidden_size), rand(hidden_size), 1e-6)
            qkv = rand(num_rows, qk_size + num_kv_heads * head_dim)
            ops.rotate_qk(qkv, rand(num_rows, 1, head_dim), rand(num_rows, 1, head_dim), qk_size, head_dim)
            ops.silu_mul(rand(num_rows, 2 * intermediate_size))
    return time.perf_counter() - started
