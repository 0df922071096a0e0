"""Adapter validation of tensor values and bytes: chunked finiteness checks, bf16, hashing, mixed dtypes,
symlinks; random and corrupted safetensors files only ever raise AdapterValidationError."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from registry.validation import (
    AdapterValidationError,
    bf16_to_float32,
    validate_adapter_dir,
)
from registry.validation import values as validation_values
from tests.registry.malformed import (
    DEFAULT_LIMITS,
    validate_upload_files,
)
from tests.registry.upload_builders import (
    DEMO_SPEC,
    WEIGHTS,
    lora_config,
    lora_tensors,
    safetensors_bytes,
    tensor_name,
    write_upload,
)

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
