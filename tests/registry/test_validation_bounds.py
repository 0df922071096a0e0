"""Adapter validation against the base model: numeric bounds on the update (registry.validation's docstring),
the base weight norms, and the peft options that restrict where LoRA goes."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from registry.validation import (
    DECODER_TARGET_MODULES,
    AdapterValidationError,
    BaseModelSpec,
    ValidationLimits,
    validate_adapter_config,
    validate_adapter_dir,
)
from tests.registry.malformed import (
    DEFAULT_LIMITS,
    assert_helpful,
)
from tests.registry.upload_builders import (
    DEMO_SPEC,
    WEIGHTS,
    config_json,
    lora_config,
    lora_tensors,
    safetensors_bytes,
)

# ---------------------------------------------------------------------------------------------------------
# Numeric bounds (see registry.validation's docstring) and the base weight norms


def _write_adapter(tmp_path: Path, config: dict, tensors: dict[str, np.ndarray], dtype: str = "F32") -> Path:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    (adapter / WEIGHTS).write_bytes(safetensors_bytes(tensors, dtype))
    return adapter


def _uniform_update(rank: int, value: float, modules: tuple[str, ...] = ("q_proj",)) -> dict[str, np.ndarray]:
    tensors = lora_tensors(rank=rank, modules=modules)
    for array in tensors.values():
        array[...] = value
    return tensors


def test_base_weight_norms_match_numpy_and_are_cached(base_model_dir: Path) -> None:
    from safetensors.numpy import load_file

    from registry.base_norms import base_weight_norms

    weights = load_file(str(base_model_dir / "model.safetensors"))
    norms = base_weight_norms(base_model_dir)
    assert norms is not None and len(norms) == DEMO_SPEC.num_layers * len(DECODER_TARGET_MODULES)
    parent = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn"}
    for (layer, module), norm in norms.items():
        expected = weights[f"model.layers.{layer}.{parent.get(module, 'mlp')}.{module}.weight"]
        assert norm == pytest.approx(float(np.linalg.norm(expected.astype(np.float64))), rel=1e-6)
    assert base_weight_norms(base_model_dir) is norms  # computed once per base model


def test_base_weight_norms_are_none_without_safetensors(tmp_path: Path) -> None:
    from registry.base_norms import base_weight_norms

    assert base_weight_norms(tmp_path) is None


def test_update_too_large_for_the_base_model_is_refused_with_the_ratio(
    tmp_path: Path, base_model_dir: Path
) -> None:
    # every value 100: within the absolute bound (|A| = 100, |2 * B| = 200 <= 256) but the update bound
    # 2 * ||B|| * ||A|| = 2 * 1600 * 1600 is ~4000x the tiny base's q_proj norm (~1.3)
    adapter = _write_adapter(tmp_path, lora_config(modules=("q_proj",)), _uniform_update(4, 100.0))
    spec = BaseModelSpec.from_model_dir(base_model_dir)
    with pytest.raises(AdapterValidationError) as excinfo:
        validate_adapter_dir(adapter, spec, DEFAULT_LIMITS)
    assert_helpful(excinfo.value, "update_too_large")
    assert "layer 0 q_proj" in excinfo.value.message and "lora_alpha" in excinfo.value.message
    # without readable base weights only the absolute bounds apply
    assert validate_adapter_dir(adapter, DEMO_SPEC, DEFAULT_LIMITS).rank == 4


@pytest.mark.parametrize(
    ("rank", "alpha", "use_rslora"),
    [
        (8, 8, False),  # peft's defaults
        (16, 32, False),
        (256, 512, True),
        (256, 4096, True),  # rsLoRA at rank 256 with alpha in the thousands: scale 256
        (64, 4096, False),
        (1, 1024, False),  # scale at the limit
    ],
)
def test_realistic_adapters_pass_against_the_real_base_model(
    tmp_path: Path, base_model_dir: Path, rank: int, alpha: int, use_rslora: bool
) -> None:
    """peft-style weights: A kaiming-uniform (bound 1/sqrt(in)), a trained update scale * B ~ N(0, 0.02)."""
    rng = np.random.default_rng(rank)
    modules = tuple(DECODER_TARGET_MODULES)
    scale = alpha / math.sqrt(rank) if use_rslora else alpha / rank
    tensors = {}
    for name, array in lora_tensors(rank=rank, modules=modules).items():
        if ".lora_A." in name:
            bound = 1 / math.sqrt(array.shape[1])
            tensors[name] = rng.uniform(-bound, bound, array.shape).astype(np.float32)
        else:
            tensors[name] = rng.normal(0, 0.02 / max(scale, 1.0), array.shape).astype(np.float32)
    config = lora_config(rank, modules, lora_alpha=alpha, use_rslora=use_rslora)
    adapter = _write_adapter(tmp_path, config, tensors, "BF16")
    info = validate_adapter_dir(adapter, BaseModelSpec.from_model_dir(base_model_dir), DEFAULT_LIMITS)
    assert info.scale == pytest.approx(scale)


def test_bounds_are_configurable_and_messages_name_the_limit(tmp_path: Path) -> None:
    tensors = _uniform_update(4, 3.0)
    adapter = _write_adapter(tmp_path, lora_config(modules=("q_proj",)), tensors)
    assert validate_adapter_dir(adapter, DEMO_SPEC, DEFAULT_LIMITS).rank == 4
    with pytest.raises(AdapterValidationError) as excinfo:
        validate_adapter_dir(adapter, DEMO_SPEC, ValidationLimits(max_abs_weight=5.0))
    assert_helpful(excinfo.value, "weights_too_large")
    assert "scale * lora_B" in excinfo.value.message and "6" in excinfo.value.message


def test_alpha_and_scale_limits_name_the_formula() -> None:
    with pytest.raises(AdapterValidationError) as excinfo:
        validate_adapter_config(
            config_json(rank=4, lora_alpha=4096, use_rslora=True), DEMO_SPEC, DEFAULT_LIMITS
        )
    assert "sqrt(r)" in excinfo.value.message and "2048" in excinfo.value.message
    limits = ValidationLimits(max_lora_alpha=64)
    with pytest.raises(AdapterValidationError, match="alpha_too_large"):
        validate_adapter_config(config_json(rank=64, lora_alpha=128), DEMO_SPEC, limits)


# ---------------------------------------------------------------------------------------------------------
# peft options that restrict where LoRA goes: layers_to_transform, layers_pattern, exclude_modules, task_type


def _only(tensors: dict[str, np.ndarray], keep: Callable[[str], bool]) -> dict[str, np.ndarray]:
    return {name: array for name, array in tensors.items() if keep(name)}


@pytest.mark.parametrize(
    "options",
    [
        {"layers_to_transform": 1},
        {"layers_to_transform": [1]},
        {"layers_to_transform": [1], "layers_pattern": "layers"},
    ],
)
def test_layers_to_transform_restricts_the_layers_with_weights(tmp_path: Path, options: dict) -> None:
    tensors = _only(lora_tensors(), lambda name: ".layers.1." in name)
    adapter = _write_adapter(tmp_path, lora_config(**options), tensors)
    info = validate_adapter_dir(adapter, DEMO_SPEC, DEFAULT_LIMITS)
    assert info.layers == (1,) and info.num_tensors == 4


def test_exclude_modules_by_name_and_by_path(tmp_path: Path) -> None:
    excluded = ("v_proj", ".layers.0.self_attn.q_proj")
    tensors = _only(lora_tensors(), lambda name: not any(e in name for e in excluded))
    config = lora_config(exclude_modules=["v_proj", "model.layers.0.self_attn.q_proj"])
    info = validate_adapter_dir(_write_adapter(tmp_path, config, tensors), DEMO_SPEC, DEFAULT_LIMITS)
    assert info.layers == (1,) and info.num_tensors == 2


@pytest.mark.parametrize("task_type", [None, "CAUSAL_LM", "absent"])
def test_causal_lm_or_no_task_type_is_accepted(task_type: str | None) -> None:
    config = lora_config(task_type=task_type)
    if task_type == "absent":
        del config["task_type"]
    assert validate_adapter_config(json.dumps(config).encode(), DEMO_SPEC, DEFAULT_LIMITS).rank == 4
