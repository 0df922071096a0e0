"""Values: one bounded-memory pass that hashes the file and checks finiteness and magnitudes (numeric bounds:
see the package docstring), then the update-norm check against the base weights."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from registry.base_norms import BaseWeightNorms
from registry.validation.safetensors_header import SafetensorsHeader, TensorEntry, _to_float32
from registry.validation.specs import (
    _DTYPE_SIZES,
    READ_CHUNK_BYTES,
    WEIGHTS_FILENAME,
    AdapterValidationError,
    LoraConfigInfo,
    ValidationLimits,
    _fail,
)
from registry.validation.tensors import parse_lora_tensor_name

# ---------------------------------------------------------------------------------------------------------
# Values: one bounded-memory pass that hashes the file and checks finiteness and magnitudes


@dataclass(frozen=True)
class TensorStats:
    """Per-tensor value statistics gathered in the hashing pass."""

    max_abs: float
    sum_squares: float  # float64 accumulation

    @property
    def norm(self) -> float:
        """Frobenius norm."""
        return math.sqrt(self.sum_squares)


def _hash_and_check_finite(
    path: Path, header: SafetensorsHeader, config: LoraConfigInfo, limits: ValidationLimits
) -> tuple[str, dict[str, TensorStats]]:
    """sha256 of the whole file and per-tensor stats; refuses NaN/Inf and values over the bounds.

    Reads tensors in file order, READ_CHUNK_BYTES at a time.
    """
    digest = hashlib.sha256(header.header_bytes)
    stats: dict[str, TensorStats] = {}
    with open(path, "rb") as f:
        f.seek(len(header.header_bytes))
        for tensor in header.tensors:  # sorted and contiguous, so this reads the file sequentially
            stats[tensor.name] = _check_tensor_values(f, tensor, digest)
            _check_magnitude(tensor, stats[tensor.name].max_abs, config, limits)
    return digest.hexdigest(), stats


def _check_magnitude(
    tensor: TensorEntry, max_abs: float, config: LoraConfigInfo, limits: ValidationLimits
) -> None:
    """|lora_A| and |scale * lora_B| (the engine folds the scale into B) must be <= max_abs_weight."""
    is_b = parse_lora_tensor_name(tensor.name)[2] == "B"
    factor = config.scale if is_b else 1.0
    if max_abs * factor <= limits.max_abs_weight:
        return
    what = f"|scale * lora_B| (scale {factor:g})" if is_b else "|lora_A|"
    raise _fail(
        "weights_too_large",
        f"tensor {tensor.name!r} has a value of magnitude {max_abs:.3g}, so {what} reaches "
        f"{max_abs * factor:.3g}, above the limit of {limits.max_abs_weight:g}; such weights overflow "
        "inference. Retrain (lower learning rate or lora_alpha) or rescale the adapter so its values are "
        "smaller",
    )


def _check_tensor_values(f: BinaryIO, tensor: TensorEntry, digest: Any) -> TensorStats:
    itemsize = _DTYPE_SIZES[tensor.dtype]
    chunk = READ_CHUNK_BYTES - READ_CHUNK_BYTES % itemsize
    remaining = tensor.end - tensor.begin
    max_abs = sum_squares = 0.0
    while remaining > 0:
        buffer = f.read(min(chunk, remaining))
        if not buffer:
            raise _fail("truncated_weights", f"{WEIGHTS_FILENAME} ended inside tensor {tensor.name!r}")
        digest.update(buffer)
        remaining -= len(buffer)
        values = _to_float32(buffer[: len(buffer) - len(buffer) % itemsize], tensor.dtype)
        if not np.isfinite(values).all():
            kind = "NaN" if np.isnan(values).any() else "Inf"
            raise _fail(
                "non_finite_values",
                f"tensor {tensor.name!r} contains {kind} values; the training run "
                "diverged. Retrain (e.g. lower learning rate) and upload finite weights",
            )
        if values.size:
            max_abs = max(max_abs, float(np.abs(values).max()))
            sum_squares += float(np.square(values, dtype=np.float64).sum())
    return TensorStats(max_abs, sum_squares)


def _check_update_norms(
    stats: dict[str, TensorStats],
    config: LoraConfigInfo,
    norms: BaseWeightNorms | None,
    limits: ValidationLimits,
) -> None:
    """Per (layer, module): scale * ||B||_F * ||A||_F <= max_delta_ratio * ||W_base||_F (when W is known)."""
    if not norms:
        return
    pairs: dict[tuple[int, str], dict[str, TensorStats]] = {}
    for name, tensor_stats in stats.items():
        layer, module, side = parse_lora_tensor_name(name)
        pairs.setdefault((layer, module), {})[side] = tensor_stats
    for (layer, module), sides in sorted(pairs.items()):
        base_norm = norms.get((layer, module))
        if base_norm is None or base_norm <= 0:
            continue
        bound = config.scale * sides["A"].norm * sides["B"].norm
        if bound > limits.max_delta_ratio * base_norm:
            raise _update_too_large_error(layer, module, bound, base_norm, limits)


def _update_too_large_error(
    layer: int, module: str, bound: float, base_norm: float, limits: ValidationLimits
) -> AdapterValidationError:
    return _fail(
        "update_too_large",
        f"layer {layer} {module}: the adapter's update can be up to scale * ||B|| * ||A|| = {bound:.3g}, "
        f"{bound / base_norm:.3g} times the base weight's norm {base_norm:.3g} (limit "
        f"{limits.max_delta_ratio:g}x); it is implausibly large for this base model (trained for another "
        "model, or diverged). Lower lora_alpha or retrain with smaller weights",
    )
