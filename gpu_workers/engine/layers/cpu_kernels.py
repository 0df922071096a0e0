"""The engine's C/OpenMP CPU kernels (layers/*_kernel.c: the segmented LoRA delta and paged decode attention),
built into one shared library on first use.

Compiled with the system C compiler (`-O3 -march=native -fopenmp`) into ~/.cache/lorahost/kernels
(LORAHOST_KERNEL_DIR), keyed by the sources, the compiler and the CPU's flags (a cached build never runs on
another CPU); the model runner loads it at start (~0.3 s the first time, milliseconds from the cache), so no
request waits for it. Without a compiler `load_cpu_kernels` returns None and callers keep their torch forms.
"""

from __future__ import annotations

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
from pathlib import Path

logger = logging.getLogger(__name__)

SOURCES = tuple(Path(__file__).with_name(name) for name in ("lora_kernel.c", "attention_kernel.c"))
HEADERS = tuple(Path(__file__).with_name(name) for name in ("bf16.h",))  # part of the build's cache key
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=gnu11")
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
# function -> argument types (every function returns void)
SIGNATURES: dict[str, list[type]] = {
    **{
        name: [_PTR, _I64, _PTR, _I64, _I64, _I64, _PTR, _I64, _PTR, _PTR, ctypes.c_int]
        for name in ("lora_delta_bf16", "lora_delta_f32")
    },
    **{
        name: [
            _PTR,
            _PTR,
            _PTR,
            _PTR,
            _PTR,
            _I64,
            _PTR,
            _I64,
            _I64,
            _I64,
            _I64,
            _I64,
            ctypes.c_float,
            ctypes.c_int,
        ]
        for name in ("decode_attention_bf16", "decode_attention_f32")
    },
}
ABI_VERSION = 1

_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | None] = {}
compile_seconds: float | None = None  # how long this process's build took (None: loaded from the cache)


def kernel_dir() -> Path:
    """Where compiled kernels are cached."""
    return Path(os.environ.get("LORAHOST_KERNEL_DIR", Path.home() / ".cache" / "lorahost" / "kernels"))


def load_cpu_kernels() -> ctypes.CDLL | None:
    """The kernel library (built on first use), or None where it cannot be built (warned once)."""
    with _lock:
        if "lib" not in _loaded:
            lib = None
            try:
                lib = _build_and_load()
            except (OSError, subprocess.SubprocessError, AttributeError) as exc:
                logger.warning("CPU kernels unavailable (%s); using the torch forms", exc)
            _loaded["lib"] = lib
        return _loaded["lib"]


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def _cpu_flags() -> str:
    try:
        return next(
            line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")
        )
    except (OSError, StopIteration):
        return platform.processor()


def x86_cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags on x86-64 Linux (/proc/cpuinfo), None where they cannot be read."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    line = _cpu_flags()
    if not line.startswith("flags"):
        return None
    return frozenset(line.split(":", 1)[1].split())


def _build_and_load() -> ctypes.CDLL | None:
    global compile_seconds
    cc = _compiler()
    if cc is None:
        logger.warning("no C compiler found: the CPU kernels are off")
        return None
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False).stdout
    digest = hashlib.sha256()
    for part in (
        *(src.read_bytes() for src in (*SOURCES, *HEADERS)),
        version.encode(),
        _cpu_flags().encode(),
        " ".join(FLAGS).encode(),
    ):
        digest.update(part)
    path = kernel_dir() / f"lorahost_kernels-{digest.hexdigest()[:20]}.so"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            out = Path(tmp) / path.name
            cmd = [cc, *FLAGS, "-o", str(out), *(str(src) for src in SOURCES), "-lm"]
            subprocess.run(cmd, check=True, capture_output=True, timeout=120)
            os.replace(out, path)  # atomic: a concurrent builder never loads a half-written file
        compile_seconds = time.perf_counter() - started
    lib = ctypes.CDLL(str(path))
    if lib.lora_kernel_abi() != ABI_VERSION:
        raise OSError(f"{path} has an unexpected ABI")
    for name, argtypes in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = None
        fn.argtypes = argtypes
    return lib
