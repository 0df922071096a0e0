"""The twin profile file: JSON and YAML round-trip, errors that name the file and the field to fix, and every
shipped profile loads with a source for each constant it gives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.twin.profile_helpers import tiny_profile, tiny_profile_dict
from twin.cost_model import CostModel
from twin.profile import ProfileError, ProfileModel, load_profile, profile_from_dict, save_profile
from twin.step_shape import StepShape

SHIPPED = sorted((Path(__file__).parents[2] / "twin" / "profiles").glob("*.json"))


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_profile_round_trips(tmp_path: Path, suffix: str) -> None:
    profile = tiny_profile(lora_form="max", scheduler_us=3.5)
    path = tmp_path / "sub" / f"p{suffix}"
    save_profile(profile, path)
    assert load_profile(path) == profile
    assert load_profile(path).to_dict() == profile.to_dict()


def test_kv_bytes_per_token_come_from_the_shape_unless_given() -> None:
    profile = tiny_profile()
    assert profile.kv_bytes_per_token == 2 * 2 * 1 * 4 * 2  # K and V x layers x kv heads x head dim x bytes
    assert profile.num_kv_tokens == 1_000_000 // 32
    data = tiny_profile_dict()
    data["memory"]["kv_bytes_per_token"] = 100
    assert profile_from_dict(data).kv_bytes_per_token == 100


def _write(tmp_path: Path, data: object, name: str = "bad.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["step"].pop("per_prefill_token_us"), r"step\.per_prefill_token_us: Field required"),
        (
            lambda d: d["step"].update(per_decode_seq_us=-1),
            r"step\.per_decode_seq_us: Input should be greater",
        ),
        (lambda d: d["step"].update(lora_form="min"), r"step\.lora_form: Input should be 'sum' or 'max'"),
        (lambda d: d["copy"].update(host_to_device_gbps=0), r"copy\.host_to_device_gbps"),
        (lambda d: d["copy"].update(prepare_gbps=-1), r"copy\.prepare_gbps: Input should be greater"),
        (lambda d: d["memory"].update(device_byte=5), r"memory\.device_byte: Extra inputs are not permitted"),
        (lambda d: d.update(version=7), r"version 7 is not supported"),
        (lambda d: d["sources"].update({"step.fixd_us": "x"}), r"unknown constants \['step\.fixd_us'\]"),
    ],
)
def test_bad_profiles_name_the_file_and_the_field(tmp_path: Path, edit: Any, message: str) -> None:
    data = tiny_profile_dict()
    edit(data)
    path = _write(tmp_path, data)
    with pytest.raises(ProfileError, match=message) as error:
        load_profile(path)
    assert str(path) in str(error.value)


def test_unreadable_and_malformed_files_say_so(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(tmp_path / "missing.json")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ProfileError, match="not valid JSON"):
        load_profile(tmp_path / "broken.json")
    (tmp_path / "broken.yaml").write_text("step: [unclosed")
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_profile(tmp_path / "broken.yaml")
    with pytest.raises(ProfileError, match="a twin profile is a mapping, got list"):
        load_profile(_write(tmp_path, [1, 2]))


def test_missing_sources_lists_given_constants_without_one() -> None:
    missing = tiny_profile().missing_sources()
    assert "step.per_prefill_token_us" in missing and "copy.host_to_device_gbps" in missing
    assert "step.fixed_us" not in missing and not any(m.startswith("model.") for m in missing)
    assert "step.min_dense_us" not in missing  # left at its default


def test_model_shape_from_a_hugging_face_config() -> None:
    config = {
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
    }
    shape = ProfileModel.from_hf_config(config, "llama-3.1-8b", dtype_bytes=2)
    assert shape.head_dim == 128
    assert shape.kv_bytes_per_token == 131072  # 2 x 32 x 8 x 128 x 2
    # q 4096+4096, k and v 4096+1024 each, o 4096+4096, gate and up 4096+14336 each, down 14336+4096
    assert shape.adapter_bytes(1) == 32 * 81920 * 2


def test_there_are_shipped_profiles() -> None:
    assert len(SHIPPED) >= 3


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_each_shipped_profile_loads_and_sources_every_constant(path: Path) -> None:
    profile = load_profile(path)
    assert profile.missing_sources() == []
    model = CostModel(profile)

    def decode(num_seqs: int) -> float:
        return model.step_seconds(StepShape(num_decode_seqs=num_seqs, decode_context_tokens=num_seqs * 512))

    def prefill(num_tokens: int) -> float:
        shape = StepShape(
            num_prefill_tokens=num_tokens, num_prefill_seqs=1, prefill_attention_tokens=num_tokens**2 / 2
        )
        return model.step_seconds(shape)

    # more work never costs less (which of a decode and a prefill costs more depends on the hardware: on a
    # launch-bound GPU a 2048-token prefill of a small model is cheaper than 32 decodes)
    assert 0 < decode(1) < decode(32) and 0 < prefill(16) < prefill(2048)


def test_a_profiles_geometry_pages_its_device_bytes_in_either_memory_mode() -> None:
    from tests.twin.profile_helpers import tiny_profile

    # 1 MB of device memory; KV of a token: 2 x 2 layers x 1 kv head x 4 x 2 B = 32 B
    profile = tiny_profile()
    unified = profile.geometry("unified", max_lora_rank=8)
    assert unified.kv_bytes_per_block == 32 * 16 and unified.num_kv_blocks == 1_000_000 // 512
    assert unified.num_adapter_pages == 0
    static = profile.geometry("static", adapter_cache_bytes=100_000, max_lora_rank=8)
    assert static.num_adapter_pages == -(-100_000 // 512)
    assert (static.num_kv_blocks + static.num_adapter_pages) * 512 <= 1_000_000 + 512
    assert profile.model.shape.kv_bytes_per_token(2) == profile.kv_bytes_per_token
