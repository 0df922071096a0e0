"""Frobenius norms of a base model's adaptable linear weights, read with numpy (no torch), cached per process.

Used by registry.validation to bound an adapter's update relative to the base weight it changes. The norms
are computed once per base model (identified by its directory and its safetensors files' names, sizes and
modification times) in one sequential, bounded-memory pass over the decoder linears' bytes.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

READ_CHUNK_BYTES = 16 * 1024 * 1024
MAX_HEADER_BYTES = 100 * 1024 * 1024
_BASE_LINEAR = re.compile(
    r"^model\.layers\.(0|[1-9][0-9]*)\.(?:self_attn|mlp)\."
    r"(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)\.weight$"
)
_NUMPY_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}
_ITEM_SIZES = {"F32": 4, "F16": 2, "BF16": 2}

BaseWeightNorms = dict[tuple[int, str], float]  # (layer, module) -> ||W||_F


def base_weight_norms(model_dir: Path) -> BaseWeightNorms | None:
    """(layer, module) -> Frobenius norm of that base linear weight; None when no readable safetensors.

    Modules stored in other dtypes (quantized, fp8) are left out: callers skip the relative check there.
    """
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        return None
    signature = tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    return _cached_norms(str(Path(model_dir).resolve()), signature)


@lru_cache(maxsize=4)
def _cached_norms(model_dir: str, signature: tuple[tuple[str, int, int], ...]) -> BaseWeightNorms | None:
    norms: BaseWeightNorms = {}
    try:
        for name, _, _ in signature:
            norms.update(_file_norms(Path(model_dir) / name))
    except (OSError, ValueError):
        return None  # unreadable or not safetensors: the absolute bounds still apply
    return norms or None


def _file_norms(path: Path) -> BaseWeightNorms:
    """Norms of the decoder linears in one safetensors file, read in file order, chunk by chunk."""
    norms: BaseWeightNorms = {}
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        if header_len > MAX_HEADER_BYTES:
            raise ValueError(f"{path} has a {header_len}-byte header; not a safetensors file")
        header: dict[str, Any] = json.loads(f.read(header_len))
        data_start = 8 + header_len
        for layer, module, dtype, begin, end in _linear_entries(header):
            f.seek(data_start + begin)
            norms[(layer, module)] = float(np.sqrt(_sum_of_squares(f, dtype, end - begin)))
    return norms


def _linear_entries(header: dict[str, Any]) -> list[tuple[int, str, str, int, int]]:
    """(layer, module, dtype, begin, end) of the adaptable linears in a header, sorted by offset."""
    entries = []
    for name, value in header.items():
        match = _BASE_LINEAR.match(name)
        if match is None or not isinstance(value, dict) or value.get("dtype") not in _NUMPY_DTYPES:
            continue
        begin, end = value["data_offsets"]
        entries.append((int(match.group(1)), match.group(2), value["dtype"], int(begin), int(end)))
    return sorted(entries, key=lambda e: e[3])


def _sum_of_squares(f: Any, dtype: str, num_bytes: int) -> float:
    """Sum of squares (float64) of `num_bytes` of `dtype` values read from f's current position."""
    total = 0.0
    remaining = num_bytes
    itemsize = _ITEM_SIZES[dtype]
    chunk = READ_CHUNK_BYTES - READ_CHUNK_BYTES % itemsize
    while remaining > 0:
        buffer = f.read(min(chunk, remaining))
        if not buffer or len(buffer) % itemsize:
            raise ValueError("safetensors file ended inside a tensor")
        remaining -= len(buffer)
        values = np.frombuffer(buffer, dtype=_NUMPY_DTYPES[dtype])
        if dtype == "BF16":
            values = (values.astype(np.uint32) << 16).view(np.float32)
        total += float(np.square(values, dtype=np.float64).sum())
    return total


def norms_to_json(norms: BaseWeightNorms | None) -> dict[str, float] | None:
    """The norms as a JSON object: "<layer>.<module>" -> norm."""
    return (
        None
        if norms is None
        else {f"{layer}.{module}": value for (layer, module), value in sorted(norms.items())}
    )


def norms_from_json(data: dict[str, float] | None) -> BaseWeightNorms | None:
    """`norms_to_json`'s inverse."""
    if not data:
        return None
    return {(int(key.split(".", 1)[0]), key.split(".", 1)[1]): float(value) for key, value in data.items()}
