"""safetensors headers parsed by hand (never with torch), and tensors read as float32 numpy arrays.

Layout: [8 bytes: little-endian u64 N][N bytes: JSON header][data buffer]; offsets are relative to the start
of the data buffer; tensors tile the buffer with no gap or overlap.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from registry.validation.specs import (
    _DTYPE_SIZES,
    SUPPORTED_DTYPES,
    WEIGHTS_FILENAME,
    AdapterValidationError,
    ValidationLimits,
    _fail,
)

# ---------------------------------------------------------------------------------------------------------
# safetensors header


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors file; offsets are absolute file positions."""

    name: str
    dtype: str  # safetensors dtype, e.g. "BF16"
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class SafetensorsHeader:
    """A checked safetensors header: tensors sorted by offset, tiling the data buffer exactly."""

    header_bytes: bytes  # the 8-byte length prefix and the JSON header, as stored
    tensors: tuple[TensorEntry, ...]
    metadata: dict[str, str]


def read_safetensors_header(path: Path, limits: ValidationLimits) -> SafetensorsHeader:
    """Read and structurally check a safetensors header (size bounded; offsets contiguous, in the file)."""
    file_size = Path(path).stat().st_size
    _check_file_size(file_size, limits)
    with open(path, "rb") as f:
        prefix = f.read(8)
        header_len = int.from_bytes(prefix, "little")
        if header_len > limits.max_header_bytes:
            raise _fail(
                "header_too_large",
                f"{WEIGHTS_FILENAME} declares a {header_len}-byte header; the limit "
                f"is {limits.max_header_bytes}. The file is corrupt or not safetensors",
            )
        if 8 + header_len > file_size:
            raise _fail(
                "truncated_weights",
                f"{WEIGHTS_FILENAME} is shorter than its own header says "
                f"({file_size} bytes); upload the complete file",
            )
        header_json = f.read(header_len)
    entries, metadata = _parse_header_json(header_json)
    data_start = 8 + header_len
    tensors = tuple(_check_entry(name, value, data_start) for name, value in entries)
    _check_tiling(tensors, data_start, file_size)
    return SafetensorsHeader(
        prefix + header_json, tuple(sorted(tensors, key=lambda t: (t.begin, t.end))), metadata
    )


def _check_file_size(file_size: int, limits: ValidationLimits) -> None:
    if file_size == 0:
        raise _fail(
            "empty_weights", f"{WEIGHTS_FILENAME} is empty; upload the file written by save_pretrained"
        )
    if file_size > limits.max_adapter_bytes:
        raise _fail(
            "weights_too_large",
            f"{WEIGHTS_FILENAME} is {file_size} bytes; the limit is "
            f"{limits.max_adapter_bytes}. Use a smaller rank or fewer target modules",
        )
    if file_size < 8:
        raise _fail(
            "truncated_weights", f"{WEIGHTS_FILENAME} is only {file_size} bytes; upload the complete file"
        )


def _parse_header_json(header_json: bytes) -> tuple[list[tuple[str, Any]], dict[str, str]]:
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in pairs]
        if len(set(keys)) != len(keys):
            raise _fail("invalid_header", f"{WEIGHTS_FILENAME} header names a tensor twice")
        return dict(pairs)

    try:
        header = json.loads(header_json.decode("utf-8"), object_pairs_hook=no_duplicates)
    except (ValueError, RecursionError) as exc:
        if isinstance(exc, AdapterValidationError):
            raise
        raise _fail(
            "invalid_header",
            f"{WEIGHTS_FILENAME} header is not valid JSON; the file is corrupt or "
            "not safetensors. Re-save with safe_serialization=True",
        ) from exc
    if not isinstance(header, dict):
        raise _fail("invalid_header", f"{WEIGHTS_FILENAME} header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise _fail("invalid_header", f"{WEIGHTS_FILENAME} __metadata__ must map strings to strings")
    if not header:
        raise _fail("empty_weights", f"{WEIGHTS_FILENAME} holds no tensors; save the trained adapter again")
    return list(header.items()), metadata


def _check_entry(name: str, value: Any, data_start: int) -> TensorEntry:
    bad = _fail(
        "invalid_header",
        f"{WEIGHTS_FILENAME} header entry {name!r} must be "
        "{dtype, shape, data_offsets} with known dtype, non-negative shape and offsets",
    )
    if not isinstance(value, dict) or set(value) != {"dtype", "shape", "data_offsets"}:
        raise bad
    dtype, shape, offsets = value["dtype"], value["shape"], value["data_offsets"]
    if not isinstance(dtype, str) or dtype not in _DTYPE_SIZES:
        raise _fail("unsupported_dtype", _dtype_message(name, dtype))
    if not _is_int_list(shape) or not _is_int_list(offsets) or len(offsets) != 2 or offsets[0] > offsets[1]:
        raise bad
    num_elements = math.prod(shape)
    if num_elements * _DTYPE_SIZES[dtype] != offsets[1] - offsets[0]:
        raise _fail(
            "invalid_header",
            f"tensor {name!r}: shape {shape} of {dtype} needs "
            f"{num_elements * _DTYPE_SIZES[dtype]} bytes but its data_offsets span "
            f"{offsets[1] - offsets[0]}; the file is corrupt",
        )
    return TensorEntry(name, dtype, tuple(shape), data_start + offsets[0], data_start + offsets[1])


def _is_int_list(value: Any) -> bool:
    return isinstance(value, list) and all(type(v) is int and v >= 0 for v in value)


def _check_tiling(tensors: tuple[TensorEntry, ...], data_start: int, file_size: int) -> None:
    """Tensors must cover [data_start, file_size) exactly: no overlap, no gap, nothing outside the file."""
    position = data_start
    for tensor in sorted(tensors, key=lambda t: (t.begin, t.end)):
        if tensor.begin < position:
            raise _fail(
                "overlapping_tensors",
                f"tensor {tensor.name!r} overlaps another tensor's bytes; the "
                "file is corrupt or crafted. Re-save with safe_serialization=True",
            )
        if tensor.begin > position:
            raise _fail(
                "invalid_header",
                f"{WEIGHTS_FILENAME} has unused bytes before tensor {tensor.name!r}; the file is corrupt",
            )
        position = tensor.end
    if position > file_size:
        raise _fail(
            "truncated_weights",
            f"{WEIGHTS_FILENAME} is {file_size} bytes but its tensors need "
            f"{position}; upload the complete file",
        )
    if position < file_size:
        raise _fail(
            "invalid_header",
            f"{WEIGHTS_FILENAME} has {file_size - position} trailing bytes after "
            "the last tensor; the file is corrupt",
        )


def _dtype_message(name: str, dtype: Any) -> str:
    return (
        f"tensor {name!r} has dtype {dtype!r}; only {sorted(SUPPORTED_DTYPES)} are accepted. "
        "Cast the adapter to float16, bfloat16 or float32 before saving"
    )


def bf16_to_float32(raw: np.ndarray) -> np.ndarray:
    """uint16 bfloat16 bit patterns -> float32 (bf16 is the high half of a float32)."""
    return (raw.astype(np.uint32) << 16).view(np.float32)


def _to_float32(buffer: bytes, dtype: str) -> np.ndarray:
    if dtype == "BF16":
        return bf16_to_float32(np.frombuffer(buffer, dtype="<u2"))
    return np.frombuffer(buffer, dtype="<f2" if dtype == "F16" else "<f4").astype(np.float32, copy=False)


def read_tensor(path: Path, tensor: TensorEntry) -> np.ndarray:
    """One tensor as a float32 array of its shape (for loaders; the tensor is read whole)."""
    with open(path, "rb") as f:
        f.seek(tensor.begin)
        buffer = f.read(tensor.end - tensor.begin)
    return _to_float32(buffer, tensor.dtype).reshape(tensor.shape)
