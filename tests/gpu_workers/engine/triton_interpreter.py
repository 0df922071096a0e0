"""Where the Triton kernel tests (LoRA and attention) run: under Triton's interpreter on CPU tensors (CI), or
compiled on a GPU.

Triton decides at its first import whether its functions (ours and its own library's) are interpreted, and reads
TRITON_INTERPRET again on later launches, so the variable is set before that import, only when this process has
not imported triton yet, has no GPU and the environment does not say otherwise, and then stays set for the session (removing
it breaks the interpreter's next launch). What else sees it: only code that imports triton, i.e. the engine's
Triton forms on CUDA, which are then no candidates (layers/triton_lora.triton_unusable_reason says why); no other
test uses triton. On a GPU machine the same tests run compiled on CUDA.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch


def kernel_device() -> tuple[torch.device | None, str]:
    """(the device the kernels can run on here, or None, and why not)."""
    if importlib.util.find_spec("triton") is None:
        return None, "triton is not installed (pip install triton; its wheel has no dependencies)"
    if "triton" not in sys.modules and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from gpu_workers.engine.layers import triton_lora_kernels

    if triton_lora_kernels.IS_INTERPRETED:
        return torch.device("cpu"), ""
    if torch.cuda.is_available():
        return torch.device("cuda"), ""
    return None, "triton was imported before the interpreter could be turned on, and there is no GPU"


KERNEL_DEVICE, WHY_NO_KERNEL_DEVICE = kernel_device()
needs_triton_kernels = pytest.mark.skipif(KERNEL_DEVICE is None, reason=WHY_NO_KERNEL_DEVICE)
