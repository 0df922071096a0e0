"""Upload file names and adapter_config.json: a plain PEFT LoRA config this platform can serve."""

from __future__ import annotations

import codecs
import json
import math
from typing import Any

from registry.validation.specs import (
    _UNSUPPORTED_CONFIG_OPTIONS,
    ALLOWED_FILENAMES,
    CONFIG_FILENAME,
    DECODER_LAYERS_PATTERN,
    MAX_CONFIG_BYTES,
    PICKLE_SUFFIXES,
    SUPPORTED_TARGET_MODULES,
    SUPPORTED_TASK_TYPES,
    VOCAB_TARGET_MODULES,
    WEIGHTS_FILENAME,
    BaseModelSpec,
    LoraConfigInfo,
    ValidationLimits,
    _fail,
    _unsupported_module_message,
)

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
    use_dora = config.get("use_dora", False)
    if not isinstance(use_dora, bool):
        raise _fail("invalid_config_value", f"use_dora must be true or false, got {use_dora!r}")
    scale = alpha / math.sqrt(rank) if use_rslora else alpha / rank
    _check_scale(scale, rank, alpha, use_rslora, limits)
    target_modules = _normalize_target_modules(config.get("target_modules"))
    vocab = [m for m in target_modules if m in VOCAB_TARGET_MODULES]
    if use_dora and vocab:
        raise _fail(
            "dora_vocab_not_supported",
            f"DoRA on {vocab} is not supported (its magnitude rescale is served on the decoder linear layers "
            "only); retrain with use_dora=False or without embed_tokens / lm_head in target_modules",
        )
    base = config.get("base_model_name_or_path")
    return LoraConfigInfo(
        rank=rank,
        alpha=alpha,
        use_rslora=use_rslora,
        scale=scale,
        target_modules=target_modules,
        base_model_name_or_path=base if isinstance(base, str) else None,
        layers_to_transform=_layers_to_transform(
            config.get("layers_to_transform"), config.get("layers_pattern")
        ),
        exclude_modules=_exclude_modules(config.get("exclude_modules")),
        use_dora=use_dora,
    )


def _decode_utf8(raw: bytes) -> str:
    """The text of UTF-8 bytes without a byte-order mark (json.loads(bytes) would also take UTF-16/32 and a
    BOM, which other JSON readers refuse: the platform accepts exactly what peft writes)."""
    message = f"{CONFIG_FILENAME} must be UTF-8 JSON without a byte-order mark (as peft's save_pretrained writes it); "
    if raw.startswith(codecs.BOM_UTF8):
        raise _fail("config_not_utf8", message + "it starts with a UTF-8 BOM: save it without one")
    if b"\x00" in raw:  # never in JSON text (escaped as \u0000 in strings); UTF-16/32 has them everywhere
        raise _fail("config_not_utf8", message + "it has NUL bytes, as UTF-16 or UTF-32 text does")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(
            "config_not_utf8", message + f"it is not UTF-8 ({exc.reason} at byte {exc.start})"
        ) from exc


def _parse_config_json(raw: bytes) -> dict[str, Any]:
    if len(raw) > MAX_CONFIG_BYTES:
        raise _fail(
            "config_too_large", f"{CONFIG_FILENAME} is {len(raw)} bytes; the limit is {MAX_CONFIG_BYTES}"
        )
    text = _decode_utf8(raw)
    try:
        config = json.loads(text)
    except ValueError as exc:
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
    if config.get("modules_to_save"):
        raise _fail(
            "modules_to_save_not_supported",
            f"modules_to_save {config['modules_to_save']!r} stores full copies of base-model modules, which "
            "cannot be shared between tenants; retrain without modules_to_save (to adapt the token embedding "
            "or the LM head, list embed_tokens / lm_head in target_modules: LoRA on them is served)",
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
    if config.get("ensure_weight_tying"):
        raise _fail(
            "unsupported_config_option",
            "ensure_weight_tying=true (one LoRA shared by a tied embed_tokens and lm_head) is not supported: each "
            "LoRA is served on its own module; retrain with ensure_weight_tying=False",
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
