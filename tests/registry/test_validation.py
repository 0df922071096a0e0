"""Adapter validation: real peft adapters pass; every malformed upload is refused with its code."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from registry import validation
from registry.validation import (
    SUPPORTED_TARGET_MODULES,
    AdapterValidationError,
    BaseModelSpec,
    ValidationLimits,
    bf16_to_float32,
    check_upload_filenames,
    parse_lora_tensor_name,
    read_safetensors_header,
    read_tensor,
    validate_adapter_config,
    validate_adapter_dir,
)
from registry.validation import values as validation_values
from tests.registry.malformed import (
    DEMO_SPEC,
    MALFORMED_CASES,
    TIGHT_LIMIT_CASES,
    TIGHT_LIMITS,
    VALID_CASES,
    WEIGHTS,
    MalformedCase,
    lora_config,
    lora_tensors,
    safetensors_bytes,
    tensor_name,
    validate_upload_files,
    write_upload,
)

DEFAULT_LIMITS = ValidationLimits()
NUM_DEMO_ADAPTERS = 5


def _refusal(case: MalformedCase, tmp_path: Path, limits: ValidationLimits) -> AdapterValidationError:
    (tmp_path / "in").mkdir()
    files = case.build(tmp_path / "in")
    with pytest.raises(AdapterValidationError) as excinfo:
        validate_upload_files(files, tmp_path / "work", DEMO_SPEC, limits)
    return excinfo.value


def _assert_helpful(error: AdapterValidationError, code: str) -> None:
    assert error.code == code, error.message
    assert len(error.message) > 30 and error.code not in error.message  # a sentence, not a slug
    assert str(error).startswith(code)


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
    _assert_helpful(_refusal(case, tmp_path, DEFAULT_LIMITS), case.expected_code)


@pytest.mark.parametrize("case", TIGHT_LIMIT_CASES, ids=lambda c: c.case_id)
def test_upload_over_tight_limits_is_refused_with_its_code(case: MalformedCase, tmp_path: Path) -> None:
    _assert_helpful(_refusal(case, tmp_path, TIGHT_LIMITS), case.expected_code)


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


def _config(**overrides: object) -> bytes:
    return json.dumps(lora_config(**overrides)).encode()


def test_rslora_scale_is_alpha_over_sqrt_rank() -> None:
    info = validate_adapter_config(_config(rank=16, lora_alpha=8, use_rslora=True), DEMO_SPEC, DEFAULT_LIMITS)
    assert info.scale == pytest.approx(2.0)
    plain = validate_adapter_config(_config(rank=16, lora_alpha=8), DEMO_SPEC, DEFAULT_LIMITS)
    assert plain.scale == pytest.approx(0.5)


def test_target_modules_accepts_full_paths_and_a_single_name() -> None:
    paths = ["model.layers.0.self_attn.q_proj", "mlp.down_proj", "q_proj"]
    info = validate_adapter_config(_config(target_modules=paths), DEMO_SPEC, DEFAULT_LIMITS)
    assert info.target_modules == ("q_proj", "down_proj")
    single = validate_adapter_config(_config(target_modules="v_proj"), DEMO_SPEC, DEFAULT_LIMITS)
    assert single.target_modules == ("v_proj",)


@pytest.mark.parametrize("peft_type", ["ADALORA", "LOHA", "LOKR", "PROMPT_TUNING", None, ["LORA"]])
def test_other_peft_types_are_refused_by_name(peft_type: object) -> None:
    with pytest.raises(AdapterValidationError) as excinfo:
        validate_adapter_config(_config(peft_type=peft_type), DEMO_SPEC, DEFAULT_LIMITS)
    assert excinfo.value.code == "unsupported_peft_type"
    if isinstance(peft_type, str):
        assert peft_type in excinfo.value.message


@pytest.mark.parametrize("value", [True, "8", None, -1])
def test_rank_must_be_a_positive_int(value: object) -> None:
    with pytest.raises(AdapterValidationError, match="invalid_rank"):
        validate_adapter_config(_config(r=value), DEMO_SPEC, DEFAULT_LIMITS)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "16", True, None])
def test_alpha_must_be_a_finite_positive_number(value: object) -> None:
    with pytest.raises(AdapterValidationError, match="invalid_alpha"):
        validate_adapter_config(_config(lora_alpha=value), DEMO_SPEC, DEFAULT_LIMITS)


@pytest.mark.parametrize("option", ["layer_replication", "target_parameters", "fan_in_fan_out"])
def test_structure_changing_options_are_refused(option: str) -> None:
    with pytest.raises(AdapterValidationError, match="unsupported_config_option"):
        validate_adapter_config(_config(**{option: [[0, 1]]}), DEMO_SPEC, DEFAULT_LIMITS)


def test_peft_null_defaults_are_accepted() -> None:
    raw = _config(modules_to_save=None, rank_pattern={}, alpha_pattern={}, layer_replication=None, bias=None)
    assert validate_adapter_config(raw, DEMO_SPEC, DEFAULT_LIMITS).rank == 4


def test_utf8_config_with_non_ascii_text_is_accepted_and_other_encodings_are_refused() -> None:
    text = json.dumps(lora_config(notes="café, 日本語"), ensure_ascii=False)
    assert validate_adapter_config(text.encode(), DEMO_SPEC, DEFAULT_LIMITS).rank == 4
    latin1 = json.dumps(lora_config(notes="café"), ensure_ascii=False).encode("latin-1")
    for raw in (text.encode("utf-16"), text.encode("utf-16-le"), text.encode("utf-8-sig"), latin1):
        with pytest.raises(AdapterValidationError) as excinfo:
            validate_adapter_config(raw, DEMO_SPEC, DEFAULT_LIMITS)
        _assert_helpful(excinfo.value, "config_not_utf8")
        assert "must be UTF-8 JSON" in excinfo.value.message


def test_oversized_config_is_refused() -> None:
    raw = _config(notes="x" * (validation.MAX_CONFIG_BYTES + 1))
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
    ],
)
def test_parse_lora_tensor_name(name: str, expected: tuple[int, str, str]) -> None:
    assert parse_lora_tensor_name(name) == expected


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("base_model.model.lm_head.lora_A.weight", "unsupported_target_module"),
        ("base_model.model.model.embed_tokens.lora_embedding_B", "unsupported_target_module"),
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
# Values: chunked finiteness, bf16, hashing


def test_bf16_to_float32_shifts_into_the_high_half() -> None:
    values = np.array([1.0, -2.5, 3.140625, np.inf, 0.0], dtype=np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype(np.uint16)
    np.testing.assert_array_equal(bf16_to_float32(bf16), values)


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
def test_nan_in_the_last_chunk_is_found_with_tiny_chunks(
    dtype: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(validation_values, "READ_CHUNK_BYTES", 6)  # not a multiple of 4: exercises alignment
    tensors = lora_tensors()
    tensors[tensor_name(1, "v_proj", "B")][-1, -1] = np.nan
    files = write_upload(tmp_path, lora_config(), safetensors_bytes(tensors, dtype))
    with pytest.raises(AdapterValidationError, match="non_finite_values"):
        validate_upload_files(files, tmp_path / "work")


def test_sha256_is_unchanged_by_chunk_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = write_upload(tmp_path, lora_config(), safetensors_bytes(lora_tensors(), "BF16"))
    expected = hashlib.sha256(files[1].read_bytes()).hexdigest()
    monkeypatch.setattr(validation_values, "READ_CHUNK_BYTES", 10)
    assert validate_upload_files(files, tmp_path / "work").sha256 == expected


def test_mixed_dtypes_are_refused(tmp_path: Path) -> None:
    tensors = lora_tensors()
    weights = safetensors_bytes(tensors, "F32", dtypes={tensor_name(0, "q_proj", "A"): "F16"})
    files = write_upload(tmp_path, lora_config(), weights)
    with pytest.raises(AdapterValidationError, match="mixed_dtypes"):
        validate_upload_files(files, tmp_path / "work")


def test_symlink_in_adapter_dir_is_refused(tmp_path: Path) -> None:
    files = write_upload(tmp_path, lora_config(), safetensors_bytes(lora_tensors()))
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_bytes(files[0].read_bytes())
    (adapter / WEIGHTS).symlink_to(files[1])
    with pytest.raises(AdapterValidationError, match="unexpected_file"):
        validate_adapter_dir(adapter, DEMO_SPEC, DEFAULT_LIMITS)


# ---------------------------------------------------------------------------------------------------------
# Fuzz: malformed bytes never crash with anything but AdapterValidationError

_FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _validate_weights_bytes(tmp_path: Path, weights: bytes) -> None:
    adapter = tmp_path / "fuzz"
    adapter.mkdir(exist_ok=True)
    (adapter / "adapter_config.json").write_text(json.dumps(lora_config()))
    (adapter / WEIGHTS).write_bytes(weights)
    try:
        validate_adapter_dir(adapter, DEMO_SPEC, DEFAULT_LIMITS)
    except AdapterValidationError:
        pass


@_FUZZ
@given(data=st.binary(max_size=2048))
def test_random_bytes_as_safetensors_only_raise_validation_errors(tmp_path: Path, data: bytes) -> None:
    _validate_weights_bytes(tmp_path, data)


@_FUZZ
@given(
    header=st.recursive(
        st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=12,
    ),
    tail=st.binary(max_size=256),
)
def test_random_json_headers_only_raise_validation_errors(
    tmp_path: Path, header: object, tail: bytes
) -> None:
    raw = json.dumps(header).encode()
    _validate_weights_bytes(tmp_path, len(raw).to_bytes(8, "little") + raw + tail)


_VALID_WEIGHTS = safetensors_bytes(lora_tensors(rank=2, modules=("q_proj",)))


@_FUZZ
@given(
    edits=st.lists(st.tuples(st.integers(0, len(_VALID_WEIGHTS) - 1), st.integers(0, 255)), max_size=6),
    cut=st.integers(0, len(_VALID_WEIGHTS)),
)
def test_corrupted_real_file_only_raises_validation_errors(tmp_path: Path, edits: list, cut: int) -> None:
    data = bytearray(_VALID_WEIGHTS)
    for position, value in edits:
        data[position] = value
    adapter = tmp_path / "fuzz"
    adapter.mkdir(exist_ok=True)
    (adapter / "adapter_config.json").write_text(json.dumps(lora_config(rank=2, modules=("q_proj",))))
    (adapter / WEIGHTS).write_bytes(bytes(data[:cut] if cut else data))
    try:
        validate_adapter_dir(adapter, DEMO_SPEC, DEFAULT_LIMITS)
    except AdapterValidationError:
        pass


# ---------------------------------------------------------------------------------------------------------
# Boundaries


def test_validation_modules_do_not_import_torch() -> None:
    code = "import sys, registry.validation, registry.archive; sys.exit('torch' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], check=False, cwd=Path(__file__).parents[2]).returncode
        == 0
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
    assert norms is not None and len(norms) == DEMO_SPEC.num_layers * len(SUPPORTED_TARGET_MODULES)
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
    _assert_helpful(excinfo.value, "update_too_large")
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
    modules = tuple(SUPPORTED_TARGET_MODULES)
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
    _assert_helpful(excinfo.value, "weights_too_large")
    assert "scale * lora_B" in excinfo.value.message and "6" in excinfo.value.message


def test_alpha_and_scale_limits_name_the_formula() -> None:
    with pytest.raises(AdapterValidationError) as excinfo:
        validate_adapter_config(_config(rank=4, lora_alpha=4096, use_rslora=True), DEMO_SPEC, DEFAULT_LIMITS)
    assert "sqrt(r)" in excinfo.value.message and "2048" in excinfo.value.message
    limits = ValidationLimits(max_lora_alpha=64)
    with pytest.raises(AdapterValidationError, match="alpha_too_large"):
        validate_adapter_config(_config(rank=64, lora_alpha=128), DEMO_SPEC, limits)


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
