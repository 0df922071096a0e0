"""The Triton LoRA kernels compile for NVIDIA GPUs (sm_80 and sm_90, bf16 / fp16 / fp32) without a GPU: Triton
lowers them to PTX and the ptxas of its wheel to a cubin. The interpreter tests (test_triton_lora.py) check the
arithmetic; this catches what only the compiler sees (types of loop bounds, pointer casts, tl.dot shapes) and
that bf16 products use the tensor cores. In a subprocess: this session's triton may be the interpreter."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed"),
]
ROOT = Path(__file__).resolve().parents[3]
_ARGS = {
    "x_ptr": "*{dt}", "out_ptr": "*{dt}", "h_ptr": "*fp32", "scales_ptr": "*fp32", "seg_ptr": "*i32",
    "row_adapter_ptr": "*i32", "desc_ptr": "*i64", "x_stride": "i64", "h_stride": "i64", "out_stride": "i64",
    "desc_stride": "i64", "in_features": "i32", "num_col_blocks": "i32",
}  # fmt: skip


def compile_kernels(capability: int, dtype: str) -> dict[str, bool]:
    """kernel name -> whether its PTX has tensor-core mma, compiled for sm_<capability> (run without
    TRITON_INTERPRET)."""
    from triton import compile as triton_compile
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource

    from gpu_workers.engine.layers import triton_lora_kernels as kernels

    assert not kernels.IS_INTERPRETED
    dot: dict[str, object] = {"UPCAST": False, "PRECISION": "ieee" if dtype == "fp32" else "tf32"}
    variants: dict[str, dict[str, object]] = {
        "sgmv_shrink": {"BLOCK_M": 16, "BLOCK_K": 64, "BLOCK_R": 16, **dot},
        "sgmv_expand": {"HAS_SCALE": True, "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_R": 16, **dot},
        "bgmv_shrink": {"BLOCK_K": 64, "BLOCK_R": 16},
        "bgmv_expand": {"HAS_SCALE": False, "BLOCK_N": 64, "BLOCK_R": 16},
    }
    has_mma = {}
    for name, constants in variants.items():
        fn = getattr(kernels, name)
        signature = {a: "constexpr" if a in constants else _ARGS[a].format(dt=dtype) for a in fn.arg_names}
        compiled = triton_compile(
            ASTSource(fn, signature, constants), target=GPUTarget("cuda", capability, 32)
        )
        assert compiled.asm.get("cubin"), name
        has_mma[name] = "mma.sync" in compiled.asm["ptx"] or "wgmma" in compiled.asm["ptx"]
    return has_mma


@pytest.mark.parametrize(("capability", "dtype"), [(90, "bf16"), (80, "fp16"), (90, "fp32")])
def test_the_kernels_compile_for_the_gpu(capability: int, dtype: str, tmp_path: Path) -> None:
    """Every kernel compiles to a cubin; SGMV's half-precision tiles run on the tensor cores (BGMV is a GEMV)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path), TRITON_DEFAULT_FP_FUSION="1", PYTHONPATH=str(ROOT))
    code = (
        "import json, sys; from tests.gpu_workers.engine.test_triton_lora_compiles import compile_kernels; "
        f"print(json.dumps(compile_kernels({capability}, {dtype!r})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    has_mma = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(has_mma) == {"sgmv_shrink", "sgmv_expand", "bgmv_shrink", "bgmv_expand"}
    if dtype != "fp32":
        assert has_mma["sgmv_shrink"] and has_mma["sgmv_expand"]
