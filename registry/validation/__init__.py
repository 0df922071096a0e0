"""Adapter file validation: pure checks of PEFT LoRA uploads against a base model (no torch).

Modules: specs (names, limits, the base model spec, the refusal type), config (file names and
adapter_config.json), safetensors_header (the header parsed by hand, tensors read with numpy), tensors
(names, shapes, pairing against the config and base model), values (hashing, finiteness, numeric bounds);
this module validates a whole adapter and re-exports the public names.

Used by the upload API (file names), the validation job (everything) and the engine's adapter loader
(tensor names, safetensors headers). Every refusal is an `AdapterValidationError` whose `code` is a short
slug for machines and whose `message` tells the tenant what is wrong and what to change.

safetensors layout (parsed here by hand, never with torch):
    [8 bytes: little-endian u64 N][N bytes: JSON header][data buffer]
    header = {tensor_name: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}}
    offsets are relative to the start of the data buffer; tensors tile the buffer with no gap or overlap.

Numeric bounds (an adapter must not be able to make inference overflow). With scale s = lora_alpha / r
(lora_alpha / sqrt(r) with use_rslora), a module's update is s * B @ A, and the engine holds A and s * B
in the serving dtype (bf16 / fp16 / fp32). `ValidationLimits` refuses, each with what to change:
  1. lora_alpha > max_lora_alpha (16384) or s > max_lora_scale (1024). Real adapters: peft's default
     alpha 8 / r 8 gives s = 1, the common alpha = 2r gives 2, rsLoRA at r = 256 with alpha in the
     thousands gives s <= 256 (4x margin to the limit).
  2. a value with |lora_A| > max_abs_weight (256) or |s * lora_B| > max_abs_weight. Trained LoRA weights
     are O(0.01-0.1), SVD-initialised ones (PiSSA, extracted LoRAs) at most ~10 (sqrt of a base singular
     value times a unit-vector entry); the limit is >= 25x that. It keeps every weight the engine holds
     (A and the folded s * B) 256x below the fp16 maximum (65504), so loading can never make inf, and with
     r <= 256 each LoRA product (x @ A, then @ s * B) is a sum of at most in_features (resp. r) terms of
     bounded size: |delta| <= in_features * r * 256^2 * max|x| < 1.2e12 * max|x|, finite in bf16 for any
     input below 1e26 (a base model's own activations are below ~1e5).
  3. when the base weights can be read (registry.base_norms, cached per base model), per layer and
     module: s * ||B||_F * ||A||_F > max_delta_ratio (1024) * ||W||_F. The left side is an upper bound on
     ||s * B @ A||_2 (and _F), so the adapted layer's gain is at most (1 + 1024) times the base weight's
     norm: the rest of the forward pass (attention scores, SwiGLU, the residual stream, RMSNorm) stays
     within ~3 orders of magnitude of what the base model itself computes, far from bf16's range. Real
     adapters: ||delta||_F / ||W||_F is ~0.01-1, and the Frobenius product over-estimates it by up to
     sqrt(r) (16x at r = 256), so even aggressive high-rank adapters stay below ~100; the tiny seeded demo
     adapters reach ~20.
fp16 has a far smaller range (65504) than bf16, and a base model's own activations may already be close to
it; there no weight bound that real adapters pass can rule out every overflow. The engine is the second
line: a request whose logits go non-finite fails alone, never its batch neighbours (gpu_workers/).
The checks stream in the same bounded-memory pass that hashes the file.
"""

from __future__ import annotations

from pathlib import Path

from registry.validation.config import (
    check_filenames_allowed,
    check_upload_filenames,
    validate_adapter_config,
)
from registry.validation.safetensors_header import (
    SafetensorsHeader,
    TensorEntry,
    bf16_to_float32,
    read_safetensors_header,
    read_tensor,
)
from registry.validation.specs import (
    ALLOWED_FILENAMES,
    CONFIG_FILENAME,
    DECODER_TARGET_MODULES,
    IGNORED_FILENAMES,
    MAX_CONFIG_BYTES,
    SUPPORTED_DTYPES,
    SUPPORTED_MODEL_TYPES,
    SUPPORTED_TARGET_MODULES,
    VOCAB_LAYER,
    VOCAB_TARGET_MODULES,
    WEIGHTS_FILENAME,
    AdapterInfo,
    AdapterValidationError,
    BaseModelSpec,
    LoraConfigInfo,
    ValidationLimits,
    _fail,
)
from registry.validation.tensors import _check_tensors, parse_lora_tensor_name
from registry.validation.values import _check_update_norms, _hash_and_check_finite

__all__ = [
    "ALLOWED_FILENAMES",
    "CONFIG_FILENAME",
    "DECODER_TARGET_MODULES",
    "IGNORED_FILENAMES",
    "MAX_CONFIG_BYTES",
    "SUPPORTED_DTYPES",
    "SUPPORTED_MODEL_TYPES",
    "SUPPORTED_TARGET_MODULES",
    "VOCAB_LAYER",
    "VOCAB_TARGET_MODULES",
    "WEIGHTS_FILENAME",
    "AdapterInfo",
    "AdapterValidationError",
    "BaseModelSpec",
    "LoraConfigInfo",
    "SafetensorsHeader",
    "TensorEntry",
    "ValidationLimits",
    "bf16_to_float32",
    "check_filenames_allowed",
    "check_upload_filenames",
    "parse_lora_tensor_name",
    "read_safetensors_header",
    "read_tensor",
    "validate_adapter_config",
    "validate_adapter_dir",
    "validate_adapter_weights",
]


# ---------------------------------------------------------------------------------------------------------
# Whole adapter


def validate_adapter_weights(
    path: Path, config: LoraConfigInfo, spec: BaseModelSpec, limits: ValidationLimits
) -> tuple[SafetensorsHeader, str, tuple[int, ...], str]:
    """Check adapter_model.safetensors; returns (header, safetensors dtype, layers, sha256)."""
    header = read_safetensors_header(path, limits)
    dtype, layers = _check_tensors(header, config, spec)
    sha256, stats = _hash_and_check_finite(path, header, config, limits)
    _check_update_norms(stats, config, spec.weight_norms, limits)
    return header, dtype, layers, sha256


def validate_adapter_dir(path: Path, spec: BaseModelSpec, limits: ValidationLimits) -> AdapterInfo:
    """Validate a directory holding exactly adapter_config.json + adapter_model.safetensors (+ README.md)."""
    path = Path(path)
    entries = sorted(path.iterdir())
    check_upload_filenames([p.name for p in entries])
    for entry in entries:
        if entry.is_symlink() or not entry.is_file():
            raise _fail("unexpected_file", f"{entry.name!r} is not a regular file; upload plain files")
    config_path, weights_path = path / CONFIG_FILENAME, path / WEIGHTS_FILENAME
    if config_path.stat().st_size > MAX_CONFIG_BYTES:
        raise _fail("config_too_large", f"{CONFIG_FILENAME} is larger than {MAX_CONFIG_BYTES} bytes")
    config = validate_adapter_config(config_path.read_bytes(), spec, limits)
    header, dtype, layers, sha256 = validate_adapter_weights(weights_path, config, spec, limits)
    return AdapterInfo(
        rank=config.rank,
        alpha=config.alpha,
        use_rslora=config.use_rslora,
        scale=config.scale,
        target_modules=config.target_modules,
        dtype=SUPPORTED_DTYPES[dtype],
        num_bytes=weights_path.stat().st_size,
        num_tensors=len(header.tensors),
        sha256=sha256,
        base_model_name_or_path=config.base_model_name_or_path,
        layers=layers,
        use_dora=config.use_dora,
    )
