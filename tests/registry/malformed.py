"""Valid and malformed adapter uploads, shared by the validation, archive and HTTP upload tests.

Every case is `MalformedCase(case_id, build, expected_code)`; `build(tmp_dir)` writes the upload into
tmp_dir and returns the file paths to send: several plain files (multipart) or one archive (builders:
tests/registry/upload_builders.py; the archive cases: tests/registry/malformed_archives.py).

- `MALFORMED_CASES` fail with `expected_code` under default `ValidationLimits()`.
- `TIGHT_LIMIT_CASES` fail with `expected_code` only under `TIGHT_LIMITS` (big files stay small in tests).
- `VALID_CASES` pass under both.
`validate_upload_files(files, work_dir, spec, limits)` is the reference pipeline the cases are checked with.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from registry.archive import extract_archive, is_archive_name
from registry.validation import (
    AdapterInfo,
    AdapterValidationError,
    BaseModelSpec,
    ValidationLimits,
    check_upload_filenames,
    validate_adapter_dir,
)
from tests.registry.malformed_archives import ARCHIVE_CASES, ARCHIVE_TIGHT_LIMIT_CASES, VALID_ARCHIVE_CASES
from tests.registry.malformed_builders import (
    bad_header_json,
    dora,
    extra_file,
    fill,
    header_too_large,
    overlapping,
    oversize,
    pickle,
    poison,
    poison_a,
    poison_magnitude,
    set,
    truncated,
    vocab,
    with_config,
    with_tensors,
    with_weights,
    wrong_base_model,
)
from tests.registry.upload_builders import (
    DEMO_SPEC,
    VOCAB_MODULES,
    VOCAB_TENSOR_NAMES,
    WEIGHTS,
    Files,
    MalformedCase,
    adapter_upload,
    add_magnitudes,
    config_bytes,
    lora_config,
    magnitude_name,
    raw_safetensors,
    tensor_name,
    valid_files,
    write_upload,
)

DEFAULT_LIMITS = ValidationLimits()
TIGHT_LIMITS = ValidationLimits(
    max_rank=64, max_adapter_bytes=64 * 1024, max_uncompressed_bytes=256 * 1024, max_archive_members=8
)
# ---------------------------------------------------------------------------------------------------------
# Reference pipeline


def validate_upload_files(
    files: Files, work_dir: Path, spec: BaseModelSpec = DEMO_SPEC, limits: ValidationLimits | None = None
) -> AdapterInfo:
    """One archive -> extract then validate; plain files -> check names, copy into a dir, validate."""
    limits = limits or ValidationLimits()
    adapter_dir = work_dir / "adapter"
    if len(files) == 1 and is_archive_name(files[0].name):
        extract_archive(files[0], adapter_dir, limits)
    else:
        check_upload_filenames([f.name for f in files])
        adapter_dir.mkdir(parents=True)
        for f in files:
            shutil.copyfile(f, adapter_dir / f.name)
    return validate_adapter_dir(adapter_dir, spec, limits)


def assert_helpful(error: AdapterValidationError, code: str) -> None:
    """The refusal has `code` and a message that is a sentence saying what to change, not a slug."""
    assert error.code == code, error.message
    assert len(error.message) > 30 and error.code not in error.message
    assert str(error).startswith(code)


# ---------------------------------------------------------------------------------------------------------
# Cases


Q_V = ("q_proj", "v_proj")
MALFORMED_CASES: list[MalformedCase] = [
    # file names
    MalformedCase("pickle_bin", pickle, "pickle_not_allowed"),
    MalformedCase(
        "missing_config", lambda d: write_upload(d, None, valid_files()[WEIGHTS]), "missing_config"
    ),
    MalformedCase("missing_weights", lambda d: write_upload(d, lora_config(), None), "missing_weights"),
    MalformedCase("extra_file", extra_file, "unexpected_file"),
    # adapter_config.json
    MalformedCase("config_not_json", lambda d: adapter_upload(d, b"{'r': 8,"), "config_not_json"),
    MalformedCase("config_not_object", lambda d: adapter_upload(d, b"[8, 16]"), "config_not_object"),
    # json.loads(bytes) guesses UTF-16/32 and skips a BOM: the platform takes exactly UTF-8 without one
    MalformedCase("config_utf16", lambda d: adapter_upload(d, config_bytes("utf-16")), "config_not_utf8"),
    MalformedCase(
        "config_utf16_be", lambda d: adapter_upload(d, config_bytes("utf-16-be")), "config_not_utf8"
    ),
    MalformedCase("config_utf32", lambda d: adapter_upload(d, config_bytes("utf-32")), "config_not_utf8"),
    MalformedCase(
        "config_utf8_bom", lambda d: adapter_upload(d, config_bytes("utf-8-sig")), "config_not_utf8"
    ),
    MalformedCase(
        "config_latin1", lambda d: adapter_upload(d, config_bytes("latin-1", notes="café")), "config_not_utf8"
    ),
    MalformedCase("peft_prefix_tuning", with_config(peft_type="PREFIX_TUNING"), "unsupported_peft_type"),
    MalformedCase("peft_ia3", with_config(peft_type="IA3"), "unsupported_peft_type"),
    MalformedCase("dora_without_magnitudes", with_config(use_dora=True), "missing_dora_magnitude"),
    MalformedCase(
        "dora_magnitude_without_use_dora", with_tensors(add_magnitudes), "unexpected_dora_magnitude"
    ),
    MalformedCase(
        "dora_magnitude_wrong_shape",
        with_tensors(
            dora(set(magnitude_name(1, "v_proj"), np.ones(7, np.float32))), lora_config(use_dora=True)
        ),
        "invalid_tensor_shape",
    ),
    MalformedCase(
        "dora_magnitude_not_finite",
        with_tensors(dora(poison_magnitude(float("nan"))), lora_config(use_dora=True)),
        "non_finite_values",
    ),
    MalformedCase(
        "dora_magnitude_too_large",
        with_tensors(dora(poison_magnitude(1e6)), lora_config(use_dora=True)),
        "weights_too_large",
    ),
    MalformedCase("use_dora_not_bool", with_config(use_dora="yes"), "invalid_config_value"),
    MalformedCase(
        "modules_to_save", with_config(modules_to_save=["lm_head"]), "modules_to_save_not_supported"
    ),
    MalformedCase("lora_bias", with_config(bias="lora_only"), "lora_bias_not_supported"),
    MalformedCase("rank_pattern", with_config(rank_pattern={"q_proj": 8}), "rank_pattern_not_supported"),
    MalformedCase("alpha_pattern", with_config(alpha_pattern={"v_proj": 32}), "rank_pattern_not_supported"),
    MalformedCase(
        "config_targets_lm_head_without_its_weights",
        with_config(modules=("q_proj", "v_proj", "lm_head")),
        "missing_lora_weights",
    ),
    MalformedCase(
        "dora_on_embed_tokens",
        with_config(modules=VOCAB_MODULES, use_dora=True),
        "dora_vocab_not_supported",
    ),
    MalformedCase(
        "ensure_weight_tying",
        with_config(modules=VOCAB_MODULES, ensure_weight_tying=True),
        "unsupported_config_option",
    ),
    MalformedCase(
        "config_targets_norm", with_config(modules=("q_proj", "norm")), "unsupported_target_module"
    ),
    MalformedCase("target_modules_regex", with_config(target_modules=".*proj"), "unsupported_target_module"),
    MalformedCase("rank_zero", with_config(r=0), "invalid_rank"),
    MalformedCase("rank_not_int", with_config(r=4.5), "invalid_rank"),
    MalformedCase("rank_over_max", with_config(r=257), "rank_too_large"),
    MalformedCase("alpha_zero", with_config(lora_alpha=0), "invalid_alpha"),
    MalformedCase("alpha_negative", with_config(lora_alpha=-8), "invalid_alpha"),
    MalformedCase("rslora_not_bool", with_config(use_rslora="yes"), "invalid_config_value"),
    MalformedCase("alpha_over_max", with_config(lora_alpha=20000), "alpha_too_large"),
    MalformedCase("scale_over_max", with_config(lora_alpha=8192), "scale_too_large"),  # 8192 / r=4
    MalformedCase("rslora_scale_over_max", with_config(lora_alpha=4096, use_rslora=True), "scale_too_large"),
    MalformedCase("task_type_seq_cls", with_config(task_type="SEQ_CLS"), "unsupported_task_type"),
    MalformedCase("task_type_seq2seq", with_config(task_type="SEQ_2_SEQ_LM"), "unsupported_task_type"),
    MalformedCase(
        "layers_to_transform_excludes_a_layer_with_weights",
        with_config(layers_to_transform=[0]),
        "module_not_targeted",
    ),
    MalformedCase(
        "layers_to_transform_not_ints", with_config(layers_to_transform="0"), "invalid_config_value"
    ),
    MalformedCase("layers_to_transform_empty", with_config(layers_to_transform=[]), "invalid_config_value"),
    MalformedCase(
        "layers_pattern_of_another_model",
        with_config(layers_to_transform=[0, 1], layers_pattern="h"),
        "unsupported_layers_pattern",
    ),
    MalformedCase(
        "layers_pattern_without_layers_to_transform",
        with_config(layers_pattern="layers"),
        "invalid_config_value",
    ),
    MalformedCase(
        "exclude_modules_regex", with_config(exclude_modules=".*q_proj"), "unsupported_config_option"
    ),
    MalformedCase(
        "excluded_module_has_weights",
        with_config(exclude_modules=["model.layers.1.self_attn.v_proj"]),
        "module_not_targeted",
    ),
    # tensor names and shapes
    MalformedCase(
        "lm_head_tensors_not_targeted",
        with_tensors(set(VOCAB_TENSOR_NAMES["lm_head"][0], np.zeros((4, 64), np.float32))),
        "module_not_targeted",
    ),
    MalformedCase(
        "embed_tokens_tensors_not_targeted",
        with_tensors(set(VOCAB_TENSOR_NAMES["embed_tokens"][0], np.zeros((4, 512), np.float32))),
        "module_not_targeted",
    ),
    MalformedCase(
        "embed_tokens_a_of_another_vocab",
        vocab(set(VOCAB_TENSOR_NAMES["embed_tokens"][0], np.zeros((4, 500), np.float32))),
        "wrong_base_model",
    ),
    MalformedCase(
        "embed_tokens_b_of_another_hidden_size",
        vocab(set(VOCAB_TENSOR_NAMES["embed_tokens"][1], np.zeros((48, 4), np.float32))),
        "wrong_base_model",
    ),
    MalformedCase(
        "embed_tokens_a_transposed",
        vocab(set(VOCAB_TENSOR_NAMES["embed_tokens"][0], np.zeros((512, 4), np.float32))),
        "invalid_tensor_shape",
    ),
    MalformedCase(
        "lm_head_b_of_another_vocab",
        vocab(set(VOCAB_TENSOR_NAMES["lm_head"][1], np.zeros((500, 4), np.float32))),
        "wrong_base_model",
    ),
    MalformedCase(
        "lm_head_a_of_another_rank",
        vocab(set(VOCAB_TENSOR_NAMES["lm_head"][0], np.zeros((8, 64), np.float32))),
        "rank_mismatch",
    ),
    MalformedCase(
        "lm_head_without_lora_b",
        vocab(lambda tensors: tensors.pop(VOCAB_TENSOR_NAMES["lm_head"][1])),
        "missing_lora_pair",
    ),
    MalformedCase(
        "embed_tokens_base_layer_copy",
        vocab(set("base_model.model.model.embed_tokens.base_layer.weight", np.zeros((512, 64), np.float32))),
        "embedding_layer_copy",
    ),
    MalformedCase(
        "lm_head_base_layer_copy",
        vocab(set("base_model.model.lm_head.base_layer.weight", np.zeros((512, 64), np.float32))),
        "embedding_layer_copy",
    ),
    MalformedCase(
        "embed_tokens_saved_as_a_linear",
        vocab(set("base_model.model.model.embed_tokens.lora_A.weight", np.zeros((4, 512), np.float32))),
        "unexpected_tensor",
    ),
    MalformedCase(
        "unexpected_tensor_name",
        with_tensors(set("optimizer.step", np.zeros((1,), np.float32))),
        "unexpected_tensor",
    ),
    MalformedCase(
        "module_not_targeted",
        with_tensors(lambda t: None, lora_config(modules=("q_proj",))),
        "module_not_targeted",
    ),
    MalformedCase(
        "targeted_module_without_weights",
        with_tensors(lambda t: None, modules=("q_proj",)),
        "missing_lora_weights",
    ),
    MalformedCase(
        "transposed_lora_A",
        with_tensors(set(tensor_name(0, "q_proj", "A"), np.zeros((64, 4), np.float32))),
        "invalid_tensor_shape",
    ),
    MalformedCase(
        "three_dim_tensor",
        with_tensors(set(tensor_name(0, "q_proj", "A"), np.zeros((1, 4, 64), np.float32))),
        "invalid_tensor_shape",
    ),
    MalformedCase("rank_mismatch", with_tensors(lambda t: None, lora_config(rank=8)), "rank_mismatch"),
    MalformedCase("wrong_base_model", wrong_base_model, "wrong_base_model"),
    MalformedCase(
        "layer_out_of_range",
        with_tensors(set(tensor_name(2, "q_proj", "A"), np.zeros((4, 64), np.float32))),
        "layer_out_of_range",
    ),
    MalformedCase(
        "lora_A_without_B", with_tensors(lambda t: t.pop(tensor_name(1, "v_proj", "B"))), "missing_lora_pair"
    ),
    MalformedCase(
        "lora_B_without_A", with_tensors(lambda t: t.pop(tensor_name(0, "q_proj", "A"))), "missing_lora_pair"
    ),
    # dtypes and values
    MalformedCase("int_dtype", lambda d: adapter_upload(d, dtype="I32"), "unsupported_dtype"),
    MalformedCase("f64_dtype", lambda d: adapter_upload(d, dtype="F64"), "unsupported_dtype"),
    MalformedCase("nan_value", with_tensors(poison(float("nan"))), "non_finite_values"),
    MalformedCase("inf_value", with_tensors(poison(float("inf"))), "non_finite_values"),
    MalformedCase("bf16_inf_value", with_tensors(poison(float("-inf")), dtype="BF16"), "non_finite_values"),
    MalformedCase("f16_overflow_inf", with_tensors(poison(1e6), dtype="F16"), "non_finite_values"),
    MalformedCase("every_value_3e38", with_tensors(fill(3e38)), "weights_too_large"),
    MalformedCase("bf16_every_value_3e38", with_tensors(fill(3e38), dtype="BF16"), "weights_too_large"),
    MalformedCase("one_huge_lora_A_value", with_tensors(poison_a(300.0)), "weights_too_large"),
    MalformedCase(  # 200 is a plausible stored value, but times the scale 2 the engine would hold 400
        "scaled_lora_B_over_max", with_tensors(fill(200.0, "B"), dtype="F16"), "weights_too_large"
    ),
    # the safetensors container
    MalformedCase("empty_weights", with_weights(lambda: b""), "empty_weights"),
    MalformedCase(
        "no_tensors", with_weights(lambda: raw_safetensors({"__metadata__": {}}, b"")), "empty_weights"
    ),
    MalformedCase("truncated_weights", with_weights(truncated), "truncated_weights"),
    MalformedCase("bad_header_json", with_weights(bad_header_json), "invalid_header"),
    MalformedCase("header_length_too_big", with_weights(header_too_large), "header_too_large"),
    MalformedCase("overlapping_offsets", with_weights(overlapping), "overlapping_tensors"),
    MalformedCase(
        "pickle_renamed_safetensors",
        with_weights(lambda: b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}q\x00X\x06\x00\x00\x00weightq"),
        "header_too_large",
    ),
    *ARCHIVE_CASES,
]

TIGHT_LIMIT_CASES: list[MalformedCase] = [
    MalformedCase("oversize_weights", oversize, "weights_too_large"),
    MalformedCase(
        "rank_over_tight_max",
        lambda d: adapter_upload(d, lora_config(rank=128), rank=128, modules=Q_V),
        "rank_too_large",
    ),
    *ARCHIVE_TIGHT_LIMIT_CASES,
]

VALID_CASES: list[MalformedCase] = [
    MalformedCase("valid_files", lambda d: write_upload(d, lora_config(), valid_files()[WEIGHTS]), ""),
    MalformedCase(
        "valid_with_readme",
        lambda d: write_upload(d, lora_config(), valid_files()[WEIGHTS], {"README.md": b"# my adapter"}),
        "",
    ),
    MalformedCase("valid_bf16", lambda d: adapter_upload(d, dtype="BF16"), ""),
    MalformedCase("valid_f16", lambda d: adapter_upload(d, dtype="F16"), ""),
    *VALID_ARCHIVE_CASES,
]

# Valid adapters with LoRA on the vocabulary modules (their infos differ from VALID_CASES' one)
VALID_VOCAB_CASES: list[MalformedCase] = [
    MalformedCase(
        "valid_embed_tokens_and_lm_head",
        lambda d: adapter_upload(d, lora_config(modules=VOCAB_MODULES), modules=VOCAB_MODULES),
        "",
    ),
    MalformedCase(
        "valid_lm_head_under_layers_to_transform",
        lambda d: adapter_upload(
            d,
            lora_config(modules=("q_proj", "lm_head"), layers_to_transform=[0, 1]),
            modules=("q_proj", "lm_head"),
        ),
        "",
    ),
]
