"""Segmented LoRA delta on CPU with a small C/OpenMP kernel (lora_kernel.c), for decode-sized segments.

Torch has no segmented matmul: a decode step's LoRA costs either one tiny matmul per (adapter, projection)
(hundreds of calls, each dominated by dispatch) or the stacked form (layers/lora.py: every token times every
adapter, then a mask), which multiplies 16 tokens by 16 adapters to use 1/16 of the products. The kernel
reads each adapter's A and B once per block of its tokens and multiplies only its own tokens: a decode step's
LoRA becomes memory-bound on the adapters' bytes, with one call per (layer, projection).

The C source is compiled on first use with the system C compiler (`-O3 -march=native -fopenmp`) into
~/.cache/lorahost/kernels (LORAHOST_KERNEL_DIR), keyed by the source, the compiler and the CPU; the runner
warms it up at start. Without a compiler (or on a GPU) `load_kernel` returns None and the engine keeps the
torch forms. Numerics: fp32 accumulation; x @ A is rounded to the model dtype (as a matmul's output would
be), and each output element is rounded once after adding its delta (as addmm_ does).
"""

from __future__ import annotations

import bisect
import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from gpu_workers.layers.lora import PROJECTIONS, LoraAdapter, LoraSegment

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("lora_kernel.c")
MAX_PARTS = 3  # = MAX_PARTS in lora_kernel.c (q, k, v)
DESC_STRIDE = 4 + 6 * MAX_PARTS
MAX_RANK_COLS = 3072  # = MAX_RANK_COLS in lora_kernel.c
# Segments of at most this many tokens go through the kernel; longer ones (prefill) through GEMMs.
MAX_KERNEL_SEGMENT_TOKENS = 16
PROJECTION_INDEX = {name: i for i, name in enumerate(PROJECTIONS)}
_KERNEL_DTYPES = {torch.bfloat16: "lora_delta_bf16", torch.float32: "lora_delta_f32"}

_lock = threading.Lock()
_loaded: dict[str, object] = {}  # "lib" -> ctypes.CDLL or None once tried
compile_seconds: float | None = None  # how long the last compile took (None: loaded from the cache)


def kernel_dir() -> Path:
    """Where compiled kernels are cached."""
    return Path(os.environ.get("LORAHOST_KERNEL_DIR", Path.home() / ".cache" / "lorahost" / "kernels"))


def _cpu_key() -> str:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = platform.processor()
    return flags


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def load_kernel() -> ctypes.CDLL | None:
    """The compiled kernel library (compiling it on first use), or None where it cannot be built."""
    with _lock:
        if "lib" in _loaded:
            return _loaded["lib"]  # type: ignore[return-value]
        lib = None
        try:
            lib = _build_and_load()
        except (OSError, subprocess.SubprocessError) as exc:
            logger.warning("LoRA CPU kernel unavailable (%s); using the torch LoRA forms", exc)
        _loaded["lib"] = lib
        return lib


def _build_and_load() -> ctypes.CDLL | None:
    global compile_seconds
    cc = _compiler()
    if cc is None:
        logger.warning("no C compiler found; the LoRA CPU kernel is off")
        return None
    source = SOURCE.read_bytes()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False).stdout
    flags = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=gnu11"]
    key = hashlib.sha256(source + version.encode() + _cpu_key().encode() + " ".join(flags).encode()).hexdigest()[:20]
    path = kernel_dir() / f"lora_kernel-{key}.so"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            out = Path(tmp) / path.name
            subprocess.run([cc, *flags, "-o", str(out), str(SOURCE)], check=True, capture_output=True, timeout=120)
            os.replace(out, path)  # atomic: concurrent builders never load a half-written file
        compile_seconds = time.perf_counter() - started
    lib = ctypes.CDLL(str(path))
    if lib.lora_kernel_abi() != 1:
        raise OSError(f"{path} has an unexpected ABI")
    for name in _KERNEL_DTYPES.values():
        fn = getattr(lib, name)
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                       ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_int]
    return lib


def is_kernel_usable(device: torch.device, dtype: torch.dtype) -> bool:
    """True when the kernel serves this device and dtype (CPU, bf16 or fp32) and it could be built."""
    return device.type == "cpu" and dtype in _KERNEL_DTYPES and load_kernel() is not None


def adapter_descriptors(adapter: LoraAdapter) -> torch.Tensor | None:
    """[num_layers, len(PROJECTIONS), DESC_STRIDE] int64 kernel descriptors of one adapter's tensors, or None
    when a tensor's layout does not fit the kernel (rows not contiguous, too many rank columns)."""
    num_layers = len(adapter.layers)
    desc = torch.zeros(num_layers, len(PROJECTIONS), DESC_STRIDE, dtype=torch.int64)
    for layer_idx, layer in enumerate(adapter.layers):
        for name, proj in layer.items():
            a = proj.a_t
            if a.stride(1) != 1 or a.shape[1] > MAX_RANK_COLS or len(proj.parts) > MAX_PARTS:
                return None
            row = [a.data_ptr(), a.stride(0), a.shape[1], len(proj.parts)]
            for r0, r1, c0, c1, b_t in proj.parts:
                if b_t.stride(1) != 1:
                    return None
                row += [r0, r1, c0, c1, b_t.data_ptr(), b_t.stride(0)]
            desc[layer_idx, PROJECTION_INDEX[name], : len(row)] = torch.tensor(row, dtype=torch.int64)
    return desc


@dataclass(frozen=True)
class KernelLora:
    """Kernel descriptors of an ordered set of adapters (holds them, so their tensors stay alive).

    desc: [num_adapters, num_layers, len(PROJECTIONS), DESC_STRIDE] int64; order: [num_adapters] positions,
    largest adapter first (the kernel's threads take them in this order).
    """

    adapters: tuple[LoraAdapter, ...]
    desc: torch.Tensor
    order: torch.Tensor


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
        ranges = tuple((bisect.bisect_left(row_list, s), bisect.bisect_left(row_list, e)) for s, e in self.segments)
        return KernelStep(self.kernel, ranges, torch.tensor(ranges, dtype=torch.int64).reshape(-1, 2))

    def add_delta(self, out: torch.Tensor, x: torch.Tensor, layer_idx: int, projection: str) -> None:
        """out[seg] += x[seg] @ A @ B for every adapter over its rows, in one kernel call.

        out: [num_tokens, out_features] (rows contiguous, updated in place); x: [num_tokens, in_features].
        """
        lib = load_kernel()
        assert lib is not None and out.stride(1) == 1
        if x.stride(1) != 1:
            x = x.contiguous()
        kernel = self.kernel
        desc = kernel.desc[:, layer_idx, PROJECTION_INDEX[projection]]
        getattr(lib, _KERNEL_DTYPES[out.dtype])(
            x.data_ptr(), x.stride(0), out.data_ptr(), out.stride(0), x.shape[1], kernel.desc.shape[0],
            desc.data_ptr(), kernel.desc.stride(0), self.seg_table.data_ptr(), kernel.order.data_ptr(),
            torch.get_num_threads(),
        )
