"""Tensor names, shapes, dtypes and A/B pairing of adapter_model.safetensors against the config and base model."""

from __future__ import annotations

import re

from registry.validation.safetensors_header import SafetensorsHeader, TensorEntry, _dtype_message
from registry.validation.specs import (
    _MODULE_PARENT,
    _TENSOR_NAME,
    _TENSOR_SIDES,
    _VOCAB_TENSOR_NAME,
    _VOCAB_TENSOR_SIDES,
    SUPPORTED_DTYPES,
    SUPPORTED_TARGET_MODULES,
    VOCAB_LAYER,
    WEIGHTS_FILENAME,
    AdapterValidationError,
    BaseModelSpec,
    LoraConfigInfo,
    _fail,
    _unsupported_module_message,
)

# ---------------------------------------------------------------------------------------------------------
# Tensor names


def parse_lora_tensor_name(name: str) -> tuple[int, str, str]:
    """PEFT tensor name -> (layer, module, "A" | "B" | "M").

    "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight" -> (3, "q_proj", "A");
    "...q_proj.lora_magnitude_vector" (DoRA) -> (3, "q_proj", "M");
    "base_model.model.model.embed_tokens.lora_embedding_A" -> (VOCAB_LAYER, "embed_tokens", "A");
    "base_model.model.lm_head.lora_B.weight" -> (VOCAB_LAYER, "lm_head", "B").
    """
    vocab = _VOCAB_TENSOR_NAME.match(name)
    if vocab is not None:
        return VOCAB_LAYER, *_parse_vocab_tensor(name, vocab.group(1).rsplit(".", 1)[-1], vocab.group(2))
    match = _TENSOR_NAME.match(name)
    if match is None:
        raise _unparsable_tensor_error(name)
    layer, parent, module, suffix = match.groups()
    side = _TENSOR_SIDES[suffix]
    if module not in SUPPORTED_TARGET_MODULES:
        raise _fail("unsupported_target_module", f"tensor {name!r}: " + _unsupported_module_message(module))
    if _MODULE_PARENT[module] != parent:
        raise _fail(
            "unexpected_tensor",
            f"tensor {name!r}: {module} belongs to {_MODULE_PARENT[module]}, not {parent}",
        )
    return int(layer), module, side


def _parse_vocab_tensor(name: str, module: str, suffix: str) -> tuple[str, str]:
    """(module, side) of an embed_tokens / lm_head tensor; refuses peft's saved copies of the base weights."""
    if suffix in ("base_layer.weight", "weight"):
        raise _fail(
            "embedding_layer_copy",
            f"tensor {name!r} is a full copy of the base model's {module} weight (peft saves one when "
            "target_modules lists embed_tokens or lm_head); every tenant shares the base model's own weights, so "
            "a changed copy cannot be served. Re-save with model.save_pretrained(dir, safe_serialization=True, "
            "save_embedding_layers=False)",
        )
    side = _VOCAB_TENSOR_SIDES[module].get(suffix)
    if side is None:
        expected = " and ".join(_VOCAB_TENSOR_SIDES[module])
        raise _fail(
            "unexpected_tensor",
            f"tensor {name!r}: peft's LoRA on {module} saves {expected}, not {suffix} (DoRA and other "
            "variants are not supported on embed_tokens / lm_head); save with peft's save_pretrained",
        )
    return module, side


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
# Tensor checks against the config and base model


def _check_magnitude_shape(tensor: TensorEntry, module: str, spec: BaseModelSpec) -> None:
    """DoRA's lora_magnitude_vector is [out_features] (one magnitude per output row of the module)."""
    out_features = spec.module_shape(module)[1]
    if tensor.shape == (out_features,):
        return
    raise _fail(
        "invalid_tensor_shape",
        f"tensor {tensor.name!r} has shape {list(tensor.shape)}; a DoRA magnitude vector of {module} on this "
        f"base model is [{out_features}] (its out_features); the adapter was trained for a different base "
        "model or saved by another tool (save with peft's save_pretrained)",
    )


def _check_tensor_shape(tensor: TensorEntry, module: str, side: str, rank: int, spec: BaseModelSpec) -> None:
    """lora_A is [r, in_features]; lora_B is [out_features, r]; a magnitude vector is [out_features]."""
    if side == "M":
        _check_magnitude_shape(tensor, module, spec)
        return
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
        if layer != VOCAB_LAYER and layer >= spec.num_layers:
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
    _check_pairs(sides, config.use_dora)
    _check_modules_present(sides, config, spec)
    return _single_dtype(header), tuple(sorted({layer for layer, _ in sides if layer != VOCAB_LAYER}))


def _not_targeted_error(name: str, config: LoraConfigInfo) -> AdapterValidationError:
    """A tensor peft would not load: its layer is outside layers_to_transform or its module is excluded."""
    return _fail(
        "module_not_targeted",
        f"tensor {name!r} is for a module this config does not adapt (layers_to_transform="
        f"{sorted(config.layers_to_transform) if config.layers_to_transform is not None else None}, "
        f"exclude_modules={list(config.exclude_modules)}), so peft would ignore it; upload the "
        "adapter_config.json saved with these weights",
    )


def _check_pairs(sides: dict[tuple[int, str], set[str]], use_dora: bool) -> None:
    for (layer, module), present in sorted(sides.items()):
        _check_magnitude_present(layer, module, present, use_dora)
        matrices = present - {"M"}
        if matrices != {"A", "B"}:
            missing = " and ".join(f"lora_{side}" for side in ("A", "B") if side not in matrices)
            has = f"lora_{next(iter(matrices))}" if matrices else "a DoRA magnitude vector"
            raise _fail(
                "missing_lora_pair",
                f"layer {layer} {module} has {has} but no {missing}; every adapted module needs both matrices",
            )


def _check_magnitude_present(layer: int, module: str, present: set[str], use_dora: bool) -> None:
    """DoRA: every adapted module has its magnitude vector; plain LoRA: none has one."""
    if use_dora and "M" not in present:
        raise _fail(
            "missing_dora_magnitude",
            f"layer {layer} {module} has no lora_magnitude_vector but adapter_config.json says use_dora: true; "
            "every module of a DoRA adapter needs its magnitude vector (save with peft's save_pretrained)",
        )
    if not use_dora and "M" in present:
        raise _fail(
            "unexpected_dora_magnitude",
            f"layer {layer} {module} has a lora_magnitude_vector (DoRA) but adapter_config.json does not say "
            "use_dora: true; upload the adapter_config.json saved with these weights",
        )


def _check_modules_present(
    sides: dict[tuple[int, str], set[str]], config: LoraConfigInfo, spec: BaseModelSpec
) -> None:
    found = {module for _, module in sides}
    layers = [VOCAB_LAYER, *range(spec.num_layers)]
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
