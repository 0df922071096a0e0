"""Adapter file validation: pure checks of PEFT LoRA uploads against a base model (no torch).

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

import hashlib
import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from registry.base_norms import BaseWeightNorms, base_weight_norms

SUPPORTED_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
SUPPORTED_TASK_TYPES = (None, "CAUSAL_LM")
DECODER_LAYERS_PATTERN = "layers"  # the ModuleList holding the decoder layers (model.layers.N) in peft's keys
CONFIG_FILENAME = "adapter_config.json"
WEIGHTS_FILENAME = "adapter_model.safetensors"
IGNORED_FILENAMES = frozenset({"README.md"})  # written by peft's save_pretrained; accepted and ignored
ALLOWED_FILENAMES = frozenset({CONFIG_FILENAME, WEIGHTS_FILENAME}) | IGNORED_FILENAMES
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
MAX_CONFIG_BYTES = 1024 * 1024
READ_CHUNK_BYTES = 4 * 1024 * 1024  # bounded memory for hashing and finiteness checks

_MODULE_PARENT = {m: "self_attn" for m in SUPPORTED_TARGET_MODULES[:4]} | {
    m: "mlp" for m in SUPPORTED_TARGET_MODULES[4:]
}
# safetensors dtype -> bytes per element (all dtypes the format defines, so sizes can be checked)
_DTYPE_SIZES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
# accepted dtypes -> the name the engine uses (torch attribute names, e.g. torch.bfloat16)
SUPPORTED_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}
_TENSOR_NAME = re.compile(
    r"^(?:base_model\.model\.)?model\.layers\.(0|[1-9][0-9]*)\.(self_attn|mlp)\.([A-Za-z0-9_]+)"
    r"\.lora_(A|B)\.weight$"
)
_UNSUPPORTED_CONFIG_OPTIONS = (  # set (non-null, non-false, non-empty) => refused
    "layer_replication",
    "target_parameters",
    "trainable_token_indices",
    "megatron_config",
    "fan_in_fan_out",
)


class AdapterValidationError(ValueError):
    """An upload refused: `code` is a short slug, `message` says what is wrong and what to change."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def _fail(code: str, message: str) -> AdapterValidationError:
    return AdapterValidationError(code, message)


# ---------------------------------------------------------------------------------------------------------
# Base model and limits


@dataclass(frozen=True)
class BaseModelSpec:
    """The linear-layer dimensions of a Llama-family base model, from its Hugging Face config.json."""

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    model_dir: Path | None = field(default=None, compare=False, repr=False)  # for the base weight norms

    @classmethod
    def from_hf_config(cls, config: dict) -> BaseModelSpec:
        """Build from a parsed config.json (model_type llama, mistral or qwen2)."""
        model_type = config.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise _fail(
                "unsupported_base_model",
                f"base model type {model_type!r} is not supported; use one of {list(SUPPORTED_MODEL_TYPES)}",
            )
        try:
            num_heads = int(config["num_attention_heads"])
            hidden_size = int(config["hidden_size"])
            return cls(
                model_type=model_type,
                hidden_size=hidden_size,
                intermediate_size=int(config["intermediate_size"]),
                num_layers=int(config["num_hidden_layers"]),
                num_heads=num_heads,
                num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
                head_dim=int(config.get("head_dim") or hidden_size // num_heads),
                vocab_size=int(config["vocab_size"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise _fail("unsupported_base_model", f"base model config.json is incomplete: {exc!r}") from exc

    @classmethod
    def from_model_dir(cls, path: Path) -> BaseModelSpec:
        """Build from a Hugging Face model directory holding config.json (and its safetensors, whose weight
        norms bound adapters' updates; see the module docstring)."""
        spec = cls.from_hf_config(json.loads((Path(path) / "config.json").read_text()))
        return replace(spec, model_dir=Path(path))

    @property
    def weight_norms(self) -> BaseWeightNorms | None:
        """(layer, module) -> Frobenius norm of the base weight; None without readable base weights."""
        return base_weight_norms(self.model_dir) if self.model_dir is not None else None

    def module_shape(self, module: str) -> tuple[int, int]:
        """(in_features, out_features) of one supported linear module of a decoder layer."""
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        shapes = {
            "q_proj": (self.hidden_size, q_size),
            "k_proj": (self.hidden_size, kv_size),
            "v_proj": (self.hidden_size, kv_size),
            "o_proj": (q_size, self.hidden_size),
            "gate_proj": (self.hidden_size, self.intermediate_size),
            "up_proj": (self.hidden_size, self.intermediate_size),
            "down_proj": (self.intermediate_size, self.hidden_size),
        }
        if module not in shapes:
            raise _fail("unsupported_target_module", _unsupported_module_message(module))
        return shapes[module]


@dataclass(frozen=True)
class ValidationLimits:
    """Upper bounds on what a tenant may upload."""

    max_rank: int = 256
    max_adapter_bytes: int = 512 * 1024 * 1024
    max_uncompressed_bytes: int = 1024 * 1024 * 1024
    max_archive_members: int = 8
    max_header_bytes: int = 8 * 1024 * 1024  # safetensors JSON header
    # numeric bounds (see the module docstring for the reasoning)
    max_lora_alpha: float = 16384.0
    max_lora_scale: float = 1024.0
    max_abs_weight: float = 256.0  # on |lora_A| and on |scale * lora_B| (the weights the engine holds)
    max_delta_ratio: float = 1024.0  # scale * ||B||_F * ||A||_F <= this * ||W_base||_F


@dataclass(frozen=True)
class LoraConfigInfo:
    """The accepted fields of an adapter_config.json."""

    rank: int
    alpha: float
    use_rslora: bool
    scale: float
    target_modules: tuple[str, ...]  # short names, in SUPPORTED_TARGET_MODULES order
    base_model_name_or_path: str | None
    layers_to_transform: frozenset[int] | None = None  # None: every layer may carry weights
    exclude_modules: tuple[str, ...] = ()  # peft list form: a module name or a suffix of its path

    def is_targeted(self, layer: int, module: str) -> bool:
        """True when peft would put LoRA on `module` of decoder `layer` under this config."""
        if module not in self.target_modules:
            return False
        if self.layers_to_transform is not None and layer not in self.layers_to_transform:
            return False
        key = f"model.layers.{layer}.{_MODULE_PARENT[module]}.{module}"
        return not any(key == name or key.endswith("." + name) for name in self.exclude_modules)


@dataclass(frozen=True)
class AdapterInfo:
    """What the platform records about a valid adapter."""

    rank: int
    alpha: float
    use_rslora: bool
    scale: float
    target_modules: tuple[str, ...]
    dtype: str  # "float16" | "bfloat16" | "float32"
    num_bytes: int  # size of adapter_model.safetensors
    num_tensors: int
    sha256: str  # hex digest of adapter_model.safetensors
    base_model_name_or_path: str | None
    layers: tuple[int, ...]  # decoder layers with LoRA weights, sorted


# ---------------------------------------------------------------------------------------------------------
# File names


def check_upload_filenames(names: list[str]) -> None:
    """Refuse pickle files, duplicates, unknown files and a missing config or weights file."""
    seen = check_filenames_allowed(names)
    if CONFIG_FILENAME not in seen:
        raise _fail("missing_config", f"{CONFIG_FILENAME} is missing; upload it next to {WEIGHTS_FILENAME}")
    if WEIGHTS_FILENAME not in seen:
        raise _fail(
            "missing_weights",
            f"{WEIGHTS_FILENAME} is missing; save the adapter with "
            "model.save_pretrained(dir, safe_serialization=True) and upload that file",
        )


def check_filenames_allowed(names: list[str]) -> set[str]:
    """Refuse pickle files, duplicates and unknown files (a partial list is fine); returns the name set."""
    for name in names:
        if name.lower().endswith(PICKLE_SUFFIXES):
            raise _fail("pickle_not_allowed", _pickle_message(name))
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise _fail("duplicate_file", f"{name!r} was sent more than once; send each file once")
        seen.add(name)
    unexpected = sorted(seen - ALLOWED_FILENAMES)
    if unexpected:
        raise _fail(
            "unexpected_file",
            f"unexpected file(s) {unexpected}; an adapter is exactly {CONFIG_FILENAME} and "
            f"{WEIGHTS_FILENAME} (README.md is allowed and ignored)",
        )
    return seen


def _pickle_message(name: str) -> str:
    return (
        f"{name!r} is a pickle-based checkpoint; loading a pickle can execute arbitrary code, so only "
        f"safetensors is accepted. Re-save with model.save_pretrained(dir, safe_serialization=True) "
        f"and upload {WEIGHTS_FILENAME}"
    )


# ---------------------------------------------------------------------------------------------------------
# adapter_config.json


def validate_adapter_config(raw: bytes, spec: BaseModelSpec, limits: ValidationLimits) -> LoraConfigInfo:
    """Parse and check adapter_config.json bytes: a plain PEFT LoRA config this platform can serve."""
    config = _parse_config_json(raw)
    _check_peft_type(config)
    _check_task_type(config.get("task_type"))
    _check_unsupported_features(config)
    rank = _check_rank(config.get("r"), limits)
    alpha = _check_alpha(config.get("lora_alpha"), limits)
    use_rslora = config.get("use_rslora", False)
    if not isinstance(use_rslora, bool):
        raise _fail("invalid_config_value", f"use_rslora must be true or false, got {use_rslora!r}")
    scale = alpha / math.sqrt(rank) if use_rslora else alpha / rank
    _check_scale(scale, rank, alpha, use_rslora, limits)
    base = config.get("base_model_name_or_path")
    return LoraConfigInfo(
        rank=rank,
        alpha=alpha,
        use_rslora=use_rslora,
        scale=scale,
        target_modules=_normalize_target_modules(config.get("target_modules")),
        base_model_name_or_path=base if isinstance(base, str) else None,
        layers_to_transform=_layers_to_transform(
            config.get("layers_to_transform"), config.get("layers_pattern")
        ),
        exclude_modules=_exclude_modules(config.get("exclude_modules")),
    )


def _parse_config_json(raw: bytes) -> dict[str, Any]:
    if len(raw) > MAX_CONFIG_BYTES:
        raise _fail(
            "config_too_large", f"{CONFIG_FILENAME} is {len(raw)} bytes; the limit is {MAX_CONFIG_BYTES}"
        )
    try:
        config = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _fail(
            "config_not_json",
            f"{CONFIG_FILENAME} is not valid JSON ({exc}); upload the file written by peft's save_pretrained",
        ) from exc
    except RecursionError as exc:
        raise _fail("config_not_json", f"{CONFIG_FILENAME} is nested too deeply to be a PEFT config") from exc
    if not isinstance(config, dict):
        raise _fail(
            "config_not_object",
            f"{CONFIG_FILENAME} must be a JSON object (a PEFT LoraConfig), got a {type(config).__name__}",
        )
    return config


def _check_peft_type(config: dict[str, Any]) -> None:
    peft_type = config.get("peft_type")
    if peft_type is None:
        raise _fail(
            "unsupported_peft_type", f"{CONFIG_FILENAME} has no peft_type; only LORA adapters are served"
        )
    if peft_type != "LORA":
        raise _fail(
            "unsupported_peft_type",
            f"peft_type {peft_type!r} is not supported; only LoRA adapters (peft_type LORA) are served. "
            "Train with peft.LoraConfig",
        )


def _check_unsupported_features(config: dict[str, Any]) -> None:
    if config.get("use_dora"):
        raise _fail(
            "dora_not_supported",
            "DoRA adapters (use_dora: true) are not supported; retrain with use_dora=False",
        )
    if config.get("modules_to_save"):
        raise _fail(
            "modules_to_save_not_supported",
            f"modules_to_save {config['modules_to_save']!r} stores full copies of base-model modules, which "
            "cannot be shared between tenants; retrain without modules_to_save",
        )
    if config.get("bias") not in (None, "none") or config.get("lora_bias"):
        raise _fail(
            "lora_bias_not_supported",
            "trained biases (bias other than 'none', or lora_bias: true) are "
            "not supported; retrain with bias='none' and lora_bias=False",
        )
    for key in ("rank_pattern", "alpha_pattern"):
        if config.get(key):
            raise _fail(
                "rank_pattern_not_supported",
                f"{key} (per-module rank or alpha) is not supported; "
                "retrain with one r and lora_alpha for all modules",
            )
    for key in _UNSUPPORTED_CONFIG_OPTIONS:
        if config.get(key):
            raise _fail(
                "unsupported_config_option", f"{key}={config[key]!r} is not supported; retrain without {key}"
            )


def _check_rank(rank: Any, limits: ValidationLimits) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise _fail("invalid_rank", f"r must be a positive integer, got {rank!r}")
    if rank > limits.max_rank:
        raise _fail(
            "rank_too_large",
            f"r={rank} is above the limit of {limits.max_rank}; retrain with r <= {limits.max_rank}",
        )
    return rank


def _check_task_type(task_type: Any) -> None:
    if task_type not in SUPPORTED_TASK_TYPES:
        raise _fail(
            "unsupported_task_type",
            f"task_type {task_type!r} is not served: this platform generates text with a causal language "
            "model, so only task_type CAUSAL_LM (or none) is accepted. Retrain with "
            "LoraConfig(task_type='CAUSAL_LM')",
        )


def _check_alpha(alpha: Any, limits: ValidationLimits) -> float:
    if (
        isinstance(alpha, bool)
        or not isinstance(alpha, int | float)
        or not math.isfinite(alpha)
        or alpha <= 0
    ):
        raise _fail("invalid_alpha", f"lora_alpha must be a positive number, got {alpha!r}")
    if alpha > limits.max_lora_alpha:
        raise _fail(
            "alpha_too_large",
            f"lora_alpha={alpha} is above the limit of {limits.max_lora_alpha:g}; retrain with a smaller "
            "lora_alpha (e.g. 2 * r)",
        )
    return float(alpha)


def _check_scale(scale: float, rank: int, alpha: float, use_rslora: bool, limits: ValidationLimits) -> None:
    if scale <= limits.max_lora_scale:
        return
    divisor = f"sqrt({rank})" if use_rslora else str(rank)
    formula = f"lora_alpha / {'sqrt(r)' if use_rslora else 'r'} = {alpha:g} / {divisor}"
    raise _fail(
        "scale_too_large",
        f"the LoRA scale {formula} = {scale:g} is above the limit of {limits.max_lora_scale:g}; lower "
        "lora_alpha or raise r and retrain",
    )


def _layers_to_transform(layers: Any, pattern: Any) -> frozenset[int] | None:
    """peft's layers_to_transform (an int or a list of layer indices) checked with its layers_pattern."""
    _check_layers_pattern(pattern, layers)
    if layers is None:
        return None
    items = [layers] if isinstance(layers, int) and not isinstance(layers, bool) else layers
    if not isinstance(items, list) or not items or not all(type(i) is int and i >= 0 for i in items):
        raise _fail(
            "invalid_config_value",
            f"layers_to_transform must be a layer index or a non-empty list of layer indices, got {layers!r}",
        )
    return frozenset(items)


def _check_layers_pattern(pattern: Any, layers: Any) -> None:
    if pattern in (None, [], ""):
        return
    if layers is None:
        raise _fail(
            "invalid_config_value",
            f"layers_pattern={pattern!r} is set without layers_to_transform (peft refuses this too); "
            "remove layers_pattern or set layers_to_transform",
        )
    patterns = [pattern] if isinstance(pattern, str) else pattern
    if not isinstance(patterns, list) or DECODER_LAYERS_PATTERN not in patterns:
        raise _fail(
            "unsupported_layers_pattern",
            f"layers_pattern={pattern!r} does not name this model's decoder layers, so peft would adapt no "
            f"layer; set layers_pattern={DECODER_LAYERS_PATTERN!r} (or remove it) and retrain",
        )


def _exclude_modules(exclude: Any) -> tuple[str, ...]:
    """peft's exclude_modules as a list of module names or path suffixes; the regex form is refused."""
    if exclude in (None, [], ""):
        return ()
    if isinstance(exclude, str):
        raise _fail(
            "unsupported_config_option",
            f"exclude_modules={exclude!r} is a regular expression, which is not evaluated here; list the "
            "excluded module names or paths instead (e.g. ['model.layers.0.self_attn.q_proj'])",
        )
    if not isinstance(exclude, list) or not all(isinstance(m, str) and m for m in exclude):
        raise _fail(
            "invalid_config_value", f"exclude_modules must be a list of module names, got {exclude!r}"
        )
    return tuple(exclude)


def _normalize_target_modules(target_modules: Any) -> tuple[str, ...]:
    """Short module names from a list of names or full module paths ("model.layers.0.self_attn.q_proj")."""
    if isinstance(target_modules, str) and target_modules in SUPPORTED_TARGET_MODULES:
        target_modules = [target_modules]
    if isinstance(target_modules, str):
        raise _fail(
            "unsupported_target_module",
            f"target_modules {target_modules!r} is a pattern; list module names instead, "
            f"from {list(SUPPORTED_TARGET_MODULES)}",
        )
    if not isinstance(target_modules, list) or not target_modules:
        raise _fail(
            "unsupported_target_module",
            f"target_modules must be a non-empty list of module names "
            f"from {list(SUPPORTED_TARGET_MODULES)}, got {target_modules!r}",
        )
    short: set[str] = set()
    for item in target_modules:
        name = item.rsplit(".", 1)[-1] if isinstance(item, str) else item
        if name not in SUPPORTED_TARGET_MODULES:
            raise _fail("unsupported_target_module", _unsupported_module_message(item))
        short.add(name)
    return tuple(m for m in SUPPORTED_TARGET_MODULES if m in short)


def _unsupported_module_message(module: Any) -> str:
    return (
        f"LoRA on {module!r} is not supported; adapters may target only the decoder linear layers "
        f"{list(SUPPORTED_TARGET_MODULES)}. Retrain with target_modules from that list"
    )


# ---------------------------------------------------------------------------------------------------------
# Tensor names


def parse_lora_tensor_name(name: str) -> tuple[int, str, str]:
    """PEFT tensor name -> (layer, module, "A" | "B").

    "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight" -> (3, "q_proj", "A").
    """
    match = _TENSOR_NAME.match(name)
    if match is None:
        raise _unparsable_tensor_error(name)
    layer, parent, module, side = match.groups()
    if module not in SUPPORTED_TARGET_MODULES:
        raise _fail("unsupported_target_module", f"tensor {name!r}: " + _unsupported_module_message(module))
    if _MODULE_PARENT[module] != parent:
        raise _fail(
            "unexpected_tensor",
            f"tensor {name!r}: {module} belongs to {_MODULE_PARENT[module]}, not {parent}",
        )
    return int(layer), module, side


def _unparsable_tensor_error(name: str) -> AdapterValidationError:
    lora_module = re.search(r"([A-Za-z0-9_]+)\.lora_(?:embedding_)?[AB]\b", name)
    if lora_module and lora_module.group(1) not in SUPPORTED_TARGET_MODULES:
        module = lora_module.group(1)
        return _fail("unsupported_target_module", f"tensor {name!r}: " + _unsupported_module_message(module))
    if re.search(r"\.lora_[AB]\.bias$", name) or name.endswith(".bias"):
        return _fail(
            "lora_bias_not_supported",
            f"tensor {name!r} is a bias; retrain with bias='none' and lora_bias=False",
        )
    return _fail(
        "unexpected_tensor",
        f"tensor {name!r} is not a PEFT LoRA weight; expected names like "
        "'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' (save with peft's save_pretrained)",
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


# ---------------------------------------------------------------------------------------------------------
# Tensor checks against the config and base model


def _check_tensor_shape(tensor: TensorEntry, module: str, side: str, rank: int, spec: BaseModelSpec) -> None:
    """lora_A is [r, in_features]; lora_B is [out_features, r]."""
    in_features, out_features = spec.module_shape(module)
    expected = (rank, in_features) if side == "A" else (out_features, rank)
    shape = tensor.shape
    if shape == expected:
        return
    if len(shape) != 2:
        raise _fail(
            "invalid_tensor_shape",
            f"tensor {tensor.name!r} has shape {list(shape)}; expected a "
            f"2-D [{expected[0]}, {expected[1]}] matrix",
        )
    if shape == expected[::-1]:
        raise _fail(
            "invalid_tensor_shape",
            f"tensor {tensor.name!r} has shape {list(shape)}, the transpose "
            f"of the expected {list(expected)}; save lora_{side} as [{expected[0]}, {expected[1]}]",
        )
    features_axis, rank_axis = (1, 0) if side == "A" else (0, 1)
    if shape[features_axis] != expected[features_axis]:
        kind = "in_features" if side == "A" else "out_features"
        raise _fail(
            "wrong_base_model",
            f"tensor {tensor.name!r} has {kind}={shape[features_axis]} but this "
            f"base model's {module} has {kind}={expected[features_axis]} (hidden_size "
            f"{spec.hidden_size}); the adapter was trained for a different base model",
        )
    raise _fail(
        "rank_mismatch",
        f"tensor {tensor.name!r} has rank {shape[rank_axis]} but adapter_config.json "
        f"says r={rank}; upload the config saved with these weights",
    )


def _check_tensors(
    header: SafetensorsHeader, config: LoraConfigInfo, spec: BaseModelSpec
) -> tuple[str, tuple[int, ...]]:
    """Check names, shapes, dtypes and A/B pairing. Returns (safetensors dtype, sorted layers)."""
    sides: dict[tuple[int, str], set[str]] = {}
    for tensor in header.tensors:
        layer, module, side = parse_lora_tensor_name(tensor.name)
        if module not in config.target_modules:
            raise _fail(
                "module_not_targeted",
                f"tensor {tensor.name!r} is for {module}, which is not in "
                f"target_modules {list(config.target_modules)}; upload the matching adapter_config.json",
            )
        if not config.is_targeted(layer, module):
            raise _not_targeted_error(tensor.name, config)
        if layer >= spec.num_layers:
            raise _fail(
                "layer_out_of_range",
                f"tensor {tensor.name!r} is for layer {layer} but the base model "
                f"has {spec.num_layers} layers (0..{spec.num_layers - 1}); the adapter was trained for "
                "a different base model",
            )
        if tensor.dtype not in SUPPORTED_DTYPES:
            raise _fail("unsupported_dtype", _dtype_message(tensor.name, tensor.dtype))
        _check_tensor_shape(tensor, module, side, config.rank, spec)
        sides.setdefault((layer, module), set()).add(side)
    _check_pairs(sides)
    _check_modules_present(sides, config, spec)
    return _single_dtype(header), tuple(sorted({layer for layer, _ in sides}))


def _not_targeted_error(name: str, config: LoraConfigInfo) -> AdapterValidationError:
    """A tensor peft would not load: its layer is outside layers_to_transform or its module is excluded."""
    return _fail(
        "module_not_targeted",
        f"tensor {name!r} is for a module this config does not adapt (layers_to_transform="
        f"{sorted(config.layers_to_transform) if config.layers_to_transform is not None else None}, "
        f"exclude_modules={list(config.exclude_modules)}), so peft would ignore it; upload the "
        "adapter_config.json saved with these weights",
    )


def _check_pairs(sides: dict[tuple[int, str], set[str]]) -> None:
    for (layer, module), present in sorted(sides.items()):
        if present != {"A", "B"}:
            missing = "B" if "A" in present else "A"
            raise _fail(
                "missing_lora_pair",
                f"layer {layer} {module} has lora_{present.pop()} but no "
                f"lora_{missing}; every adapted module needs both matrices",
            )


def _check_modules_present(
    sides: dict[tuple[int, str], set[str]], config: LoraConfigInfo, spec: BaseModelSpec
) -> None:
    found = {module for _, module in sides}
    layers = range(spec.num_layers)
    adapted = [m for m in config.target_modules if any(config.is_targeted(i, m) for i in layers)]
    missing = [m for m in adapted if m not in found]
    if missing:
        raise _fail(
            "missing_lora_weights",
            f"target_modules lists {missing} but {WEIGHTS_FILENAME} has no "
            "weights for them; upload the config saved with these weights",
        )


def _single_dtype(header: SafetensorsHeader) -> str:
    dtypes = sorted({t.dtype for t in header.tensors})
    if len(dtypes) != 1:
        raise _fail(
            "mixed_dtypes", f"{WEIGHTS_FILENAME} mixes dtypes {dtypes}; cast all tensors to one dtype"
        )
    return dtypes[0]


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
    )
