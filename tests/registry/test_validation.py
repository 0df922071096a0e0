"""Adapter validation: real peft adapters pass; every malformed upload is refused with its code."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from registry import validation
from registry.validation import (
    SUPPORTED_TARGET_MODULES,
    VOCAB_LAYER,
    AdapterValidationError,
    BaseModelSpec,
    ValidationLimits,
    check_upload_filenames,
    parse_lora_tensor_name,
    read_safetensors_header,
    read_tensor,
    validate_adapter_config,
    validate_adapter_dir,
)
from tests.registry.malformed import (
    DEFAULT_LIMITS,
    MALFORMED_CASES,
    TIGHT_LIMIT_CASES,
    TIGHT_LIMITS,
    VALID_CASES,
    VALID_VOCAB_CASES,
    assert_helpful,
    validate_upload_files,
)
from tests.registry.upload_builders import (
    DEMO_SPEC,
    WEIGHTS,
    MalformedCase,
    add_magnitudes,
    config_json,
    lora_config,
    lora_tensors,
    magnitude_name,
    safetensors_bytes,
    write_upload,
)

NUM_DEMO_ADAPTERS = 5


def _refusal(case: MalformedCase, tmp_path: Path, limits: ValidationLimits) -> AdapterValidationError:
    (tmp_path / "in").mkdir()
    files = case.build(tmp_path / "in")
    with pytest.raises(AdapterValidationError) as excinfo:
        validate_upload_files(files, tmp_path / "work", DEMO_SPEC, limits)
    return excinfo.value


# ---------------------------------------------------------------------------------------------------------
# Real peft adapters


def test_demo_spec_is_the_tiny_demo_base_model(base_model_dir: Path) -> None:
    assert BaseModelSpec.from_model_dir(base_model_dir) == DEMO_SPEC


@pytest.mark.parametrize("index", range(NUM_DEMO_ADAPTERS))
def test_real_peft_adapter_validates_and_info_matches_its_config(
    index: int, adapter_dirs: dict[str, Path], base_model_dir: Path
) -> None:
    adapter_dir = sorted(adapter_dirs.values())[index]
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    weights = adapter_dir / "adapter_model.safetensors"

    info = validate_adapter_dir(adapter_dir, BaseModelSpec.from_model_dir(base_model_dir), DEFAULT_LIMITS)

    assert info.rank == config["r"]
    assert info.alpha == config["lora_alpha"]
    assert info.use_rslora == config["use_rslora"]
    divisor = math.sqrt(config["r"]) if config["use_rslora"] else config["r"]
    assert info.scale == pytest.approx(config["lora_alpha"] / divisor)
    assert set(info.target_modules) == set(config["target_modules"])
    assert info.base_model_name_or_path == config["base_model_name_or_path"]
    assert info.dtype == "float32"
    assert info.num_bytes == weights.stat().st_size
    assert info.sha256 == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert info.layers == (0, 1)
    assert info.num_tensors == 2 * len(config["target_modules"]) * DEMO_SPEC.num_layers


def test_demo_adapters_cover_rslora_and_several_ranks(adapter_dirs: dict[str, Path]) -> None:
    infos = [validate_adapter_dir(d, DEMO_SPEC, DEFAULT_LIMITS) for d in adapter_dirs.values()]
    assert len({i.rank for i in infos}) >= 4 and any(i.use_rslora for i in infos)


def test_read_tensor_matches_safetensors_library(adapter_dirs: dict[str, Path]) -> None:
    from safetensors.numpy import load_file

    weights = next(iter(adapter_dirs.values())) / WEIGHTS
    expected = load_file(str(weights))
    header = read_safetensors_header(weights, DEFAULT_LIMITS)
    assert {t.name for t in header.tensors} == set(expected)
    for tensor in header.tensors:
        np.testing.assert_array_equal(read_tensor(weights, tensor), expected[tensor.name])


# ---------------------------------------------------------------------------------------------------------
# Case tables


def test_case_tables_are_large_and_ids_unique() -> None:
    ids = [c.case_id for c in MALFORMED_CASES + TIGHT_LIMIT_CASES + VALID_CASES]
    assert len(MALFORMED_CASES) >= 25 and len(ids) == len(set(ids))


@pytest.mark.parametrize("case", MALFORMED_CASES, ids=lambda c: c.case_id)
def test_malformed_upload_is_refused_with_its_code(case: MalformedCase, tmp_path: Path) -> None:
    assert_helpful(_refusal(case, tmp_path, DEFAULT_LIMITS), case.expected_code)


@pytest.mark.parametrize("case", TIGHT_LIMIT_CASES, ids=lambda c: c.case_id)
def test_upload_over_tight_limits_is_refused_with_its_code(case: MalformedCase, tmp_path: Path) -> None:
    assert_helpful(_refusal(case, tmp_path, TIGHT_LIMITS), case.expected_code)


@pytest.mark.parametrize("limits", [DEFAULT_LIMITS, TIGHT_LIMITS], ids=["default", "tight"])
@pytest.mark.parametrize("case", VALID_CASES, ids=lambda c: c.case_id)
def test_valid_upload_passes(case: MalformedCase, limits: ValidationLimits, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    info = validate_upload_files(case.build(tmp_path / "in"), tmp_path / "work", DEMO_SPEC, limits)
    assert info.rank == 4 and info.target_modules == ("q_proj", "v_proj") and info.num_tensors == 8


# ---------------------------------------------------------------------------------------------------------
# Messages that must say what to change


def test_pickle_refusal_explains_code_execution_and_the_fix() -> None:
    with pytest.raises(AdapterValidationError) as excinfo:
        check_upload_filenames(["adapter_config.json", "adapter_model.bin"])
    assert excinfo.value.code == "pickle_not_allowed"
    assert "arbitrary code" in excinfo.value.message
    assert "safe_serialization=True" in excinfo.value.message


@pytest.mark.parametrize("name", ["model.PT", "weights.pth", "state.pkl", "last.ckpt", "adapter_model.bin"])
def test_every_pickle_suffix_is_refused_before_other_name_checks(name: str) -> None:
    with pytest.raises(AdapterValidationError, match="pickle_not_allowed"):
        check_upload_filenames([name, name])


def test_wrong_base_model_names_expected_and_actual_dims(tmp_path: Path) -> None:
    case = next(c for c in MALFORMED_CASES if c.case_id == "wrong_base_model")
    message = _refusal(case, tmp_path, DEFAULT_LIMITS).message
    assert "in_features=128" in message and "in_features=64" in message


def test_wrong_base_model_on_out_features_only(tmp_path: Path) -> None:
    wider_kv = BaseModelSpec("llama", 64, 176, 2, 4, 4, 16, 512)  # k/v out = 64 instead of 32
    modules = ("k_proj",)
    files = write_upload(
        tmp_path, lora_config(modules=modules), safetensors_bytes(lora_tensors(wider_kv, modules=modules))
    )
    with pytest.raises(AdapterValidationError) as excinfo:
        validate_upload_files(files, tmp_path / "work")
    assert excinfo.value.code == "wrong_base_model"
    assert "out_features=64" in excinfo.value.message and "out_features=32" in excinfo.value.message


def test_rank_mismatch_names_both_ranks(tmp_path: Path) -> None:
    case = next(c for c in MALFORMED_CASES if c.case_id == "rank_mismatch")
    message = _refusal(case, tmp_path, DEFAULT_LIMITS).message
    assert "rank 4" in message and "r=8" in message


# ---------------------------------------------------------------------------------------------------------
# Config parsing details


def test_rslora_scale_is_alpha_over_sqrt_rank() -> None:
    info = validate_adapter_config(
        config_json(rank=16, lora_alpha=8, use_rslora=True), DEMO_SPEC, DEFAULT_LIMITS
    )
    assert info.scale == pytest.approx(2.0)
    plain = validate_adapter_config(config_json(rank=16, lora_alpha=8), DEMO_SPEC, DEFAULT_LIMITS)
    assert plain.scale == pytest.approx(0.5)


def test_target_modules_accepts_full_paths_and_a_single_name() -> None:
    paths = ["model.layers.0.self_attn.q_proj", "mlp.down_proj", "q_proj"]
    info = validate_adapter_config(config_json(target_modules=paths), DEMO_SPEC, DEFAULT_LIMITS)
    assert info.target_modules == ("q_proj", "down_proj")
    single = validate_adapter_config(config_json(target_modules="v_proj"), DEMO_SPEC, DEFAULT_LIMITS)
    assert single.target_modules == ("v_proj",)


@pytest.mark.parametrize("peft_type", ["ADALORA", "LOHA", "LOKR", "PROMPT_TUNING", None, ["LORA"]])
def test_other_peft_types_are_refused_by_name(peft_type: object) -> None:
    with pytest.raises(AdapterValidationError) as excinfo:
        validate_adapter_config(config_json(peft_type=peft_type), DEMO_SPEC, DEFAULT_LIMITS)
    assert excinfo.value.code == "unsupported_peft_type"
    if isinstance(peft_type, str):
        assert peft_type in excinfo.value.message


@pytest.mark.parametrize("value", [True, "8", None, -1])
def test_rank_must_be_a_positive_int(value: object) -> None:
    with pytest.raises(AdapterValidationError, match="invalid_rank"):
        validate_adapter_config(config_json(r=value), DEMO_SPEC, DEFAULT_LIMITS)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "16", True, None])
def test_alpha_must_be_a_finite_positive_number(value: object) -> None:
    with pytest.raises(AdapterValidationError, match="invalid_alpha"):
        validate_adapter_config(config_json(lora_alpha=value), DEMO_SPEC, DEFAULT_LIMITS)


@pytest.mark.parametrize("option", ["layer_replication", "target_parameters", "fan_in_fan_out"])
def test_structure_changing_options_are_refused(option: str) -> None:
    with pytest.raises(AdapterValidationError, match="unsupported_config_option"):
        validate_adapter_config(config_json(**{option: [[0, 1]]}), DEMO_SPEC, DEFAULT_LIMITS)


def test_peft_null_defaults_are_accepted() -> None:
    raw = config_json(
        modules_to_save=None, rank_pattern={}, alpha_pattern={}, layer_replication=None, bias=None
    )
    assert validate_adapter_config(raw, DEMO_SPEC, DEFAULT_LIMITS).rank == 4


def test_utf8_config_with_non_ascii_text_is_accepted_and_other_encodings_are_refused() -> None:
    text = json.dumps(lora_config(notes="café, 日本語"), ensure_ascii=False)
    assert validate_adapter_config(text.encode(), DEMO_SPEC, DEFAULT_LIMITS).rank == 4
    latin1 = json.dumps(lora_config(notes="café"), ensure_ascii=False).encode("latin-1")
    for raw in (text.encode("utf-16"), text.encode("utf-16-le"), text.encode("utf-8-sig"), latin1):
        with pytest.raises(AdapterValidationError) as excinfo:
            validate_adapter_config(raw, DEMO_SPEC, DEFAULT_LIMITS)
        assert_helpful(excinfo.value, "config_not_utf8")
        assert "must be UTF-8 JSON" in excinfo.value.message


def test_oversized_config_is_refused() -> None:
    raw = config_json(notes="x" * (validation.MAX_CONFIG_BYTES + 1))
    with pytest.raises(AdapterValidationError, match="config_too_large"):
        validate_adapter_config(raw, DEMO_SPEC, DEFAULT_LIMITS)


# ---------------------------------------------------------------------------------------------------------
# Base model spec, tensor names


def test_module_shapes_follow_grouped_query_attention() -> None:
    assert DEMO_SPEC.module_shape("q_proj") == (64, 64)
    assert DEMO_SPEC.module_shape("k_proj") == (64, 32)
    assert DEMO_SPEC.module_shape("o_proj") == (64, 64)
    assert DEMO_SPEC.module_shape("gate_proj") == (64, 176)
    assert DEMO_SPEC.module_shape("down_proj") == (176, 64)
    assert {m for m in SUPPORTED_TARGET_MODULES if DEMO_SPEC.module_shape(m)} == set(SUPPORTED_TARGET_MODULES)


def test_spec_from_mistral_and_qwen2_configs() -> None:
    mistral = {
        "model_type": "mistral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": None,
        "vocab_size": 32000,
    }
    spec = BaseModelSpec.from_hf_config(mistral)
    assert spec.head_dim == 128 and spec.module_shape("k_proj") == (4096, 1024)
    qwen = {**mistral, "model_type": "qwen2", "num_key_value_heads": None, "head_dim": 64}
    spec = BaseModelSpec.from_hf_config(qwen)
    assert spec.num_kv_heads == 32 and spec.module_shape("q_proj") == (4096, 2048)


def test_spec_refuses_other_model_types() -> None:
    with pytest.raises(AdapterValidationError, match="unsupported_base_model"):
        BaseModelSpec.from_hf_config({"model_type": "gpt2", "hidden_size": 768})


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight", (3, "q_proj", "A")),
        ("base_model.model.model.layers.12.mlp.down_proj.lora_B.weight", (12, "down_proj", "B")),
        ("model.layers.0.self_attn.o_proj.lora_B.weight", (0, "o_proj", "B")),
        ("base_model.model.model.embed_tokens.lora_embedding_A", (VOCAB_LAYER, "embed_tokens", "A")),
        ("base_model.model.model.embed_tokens.lora_embedding_B", (VOCAB_LAYER, "embed_tokens", "B")),
        ("base_model.model.lm_head.lora_A.weight", (VOCAB_LAYER, "lm_head", "A")),
        ("base_model.model.lm_head.lora_B.weight", (VOCAB_LAYER, "lm_head", "B")),
    ],
)
def test_parse_lora_tensor_name(name: str, expected: tuple[int, str, str]) -> None:
    assert parse_lora_tensor_name(name) == expected


def test_peft_adapter_on_embed_tokens_and_lm_head_validates_and_its_saved_base_copies_are_refused(
    base_model_dir: Path, tmp_path: Path
) -> None:
    """peft's own files: LoRA on embed_tokens and lm_head is accepted (its layers are the decoder layers only);
    saved with peft's default save_embedding_layers the base weights' full copies are refused, saying how to
    re-save."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    modules = ["q_proj", "embed_tokens", "lm_head"]
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(str(base_model_dir)),
        LoraConfig(r=4, lora_alpha=8, target_modules=modules, task_type="CAUSAL_LM"),
    )
    spec = BaseModelSpec.from_model_dir(base_model_dir)
    model.save_pretrained(str(tmp_path / "lean"), save_embedding_layers=False)
    info = validate_adapter_dir(tmp_path / "lean", spec, ValidationLimits())
    assert info.target_modules == ("q_proj", "embed_tokens", "lm_head")
    assert info.layers == tuple(range(spec.num_layers))
    model.save_pretrained(str(tmp_path / "with_copies"))
    with pytest.raises(AdapterValidationError) as excinfo:
        validate_adapter_dir(tmp_path / "with_copies", spec, ValidationLimits())
    assert excinfo.value.code == "embedding_layer_copy"
    assert "save_embedding_layers=False" in excinfo.value.message


@pytest.mark.parametrize("case", VALID_VOCAB_CASES, ids=lambda c: c.case_id)
def test_lora_on_embed_tokens_and_lm_head_with_the_base_models_shapes_passes(
    case: MalformedCase, tmp_path: Path
) -> None:
    (tmp_path / "in").mkdir()
    info = validate_upload_files(case.build(tmp_path / "in"), tmp_path / "work", DEMO_SPEC, DEFAULT_LIMITS)
    assert "lm_head" in info.target_modules and info.layers == (0, 1)


def test_modules_to_save_refusal_points_to_lora_on_the_vocab_modules() -> None:
    with pytest.raises(AdapterValidationError) as excinfo:
        validate_adapter_config(config_json(modules_to_save=["lm_head"]), DEMO_SPEC, ValidationLimits())
    assert excinfo.value.code == "modules_to_save_not_supported"
    assert "full copies" in excinfo.value.message and "target_modules" in excinfo.value.message


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("base_model.model.lm_head.lora_embedding_A", "unexpected_tensor"),
        ("base_model.model.model.embed_tokens.lora_B.weight", "unexpected_tensor"),
        ("base_model.model.model.embed_tokens.base_layer.weight", "embedding_layer_copy"),
        ("base_model.model.lm_head.weight", "embedding_layer_copy"),
        ("base_model.model.model.norm.lora_A.weight", "unsupported_target_module"),
        ("base_model.model.model.layers.0.self_attn.rotary.lora_A.weight", "unsupported_target_module"),
        ("base_model.model.model.layers.0.mlp.q_proj.lora_A.weight", "unexpected_tensor"),
        ("base_model.model.model.layers.01.self_attn.q_proj.lora_A.weight", "unexpected_tensor"),
        ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight", "unexpected_tensor"),
        ("base_model.model.model.layers.0.self_attn.q_proj.lora_B.bias", "lora_bias_not_supported"),
        ("base_model.model.model.layers.0.self_attn.q_proj.weight", "unexpected_tensor"),
    ],
)
def test_parse_lora_tensor_name_refuses_with_a_clear_code(name: str, code: str) -> None:
    with pytest.raises(AdapterValidationError) as excinfo:
        parse_lora_tensor_name(name)
    assert excinfo.value.code == code and name in excinfo.value.message


# ---------------------------------------------------------------------------------------------------------
# Boundaries


def test_validation_modules_do_not_import_torch() -> None:
    code = "import sys, registry.validation, registry.archive; sys.exit('torch' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], check=False, cwd=Path(__file__).parents[2]).returncode
        == 0
    )


def test_dora_adapter_with_magnitude_vectors_validates(tmp_path: Path) -> None:
    """DoRA (use_dora: true): every adapted module's lora_magnitude_vector [out_features] is accepted and the
    adapter is recorded as DoRA; rsLoRA with DoRA too."""
    for use_rslora in (False, True):
        weights = safetensors_bytes(add_magnitudes(lora_tensors()))
        work = tmp_path / f"rs{use_rslora}"
        (work / "in").mkdir(parents=True)
        files = write_upload(work / "in", lora_config(use_dora=True, use_rslora=use_rslora), weights)
        info = validate_upload_files(files, work / "work", DEMO_SPEC, DEFAULT_LIMITS)
        assert info.use_dora and info.use_rslora == use_rslora and info.num_tensors == 12


def test_parse_dora_magnitude_vector_name() -> None:
    assert parse_lora_tensor_name(magnitude_name(3, "down_proj")) == (3, "down_proj", "M")
