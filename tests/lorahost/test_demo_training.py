"""The demo's real adapters: a short peft fine-tune, saved as a valid adapter, trained once and reused."""

from __future__ import annotations

from pathlib import Path

import pytest

from lorahost import demo_training
from lorahost.demo_training import TrainingRecipe, demo_adapter_names, ensure_demo_adapters
from registry.validation import AdapterInfo, BaseModelSpec, ValidationLimits, validate_adapter_dir

QUICK = TrainingRecipe(rank=4, lora_alpha=8, target_modules=("q_proj", "v_proj"), max_steps=2, batch_size=2)


def test_trains_valid_adapters_once_and_reuses_them(
    base_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    adapters = ensure_demo_adapters(base_model_dir, tmp_path, QUICK)
    assert list(adapters) == demo_adapter_names() == ["pirate", "french"]
    spec = BaseModelSpec.from_model_dir(base_model_dir)
    for name, path in adapters.items():
        info = validate_adapter_dir_without_stamp(path, spec)
        assert info.rank == 4 and info.target_modules == ("q_proj", "v_proj")
        assert info.use_dora is (name == "french")  # the demo serves a DoRA adapter beside a LoRA one

    def must_not_train(*_args: object) -> None:
        raise AssertionError("an up-to-date adapter was retrained")

    monkeypatch.setattr(demo_training, "train_adapter", must_not_train)
    assert ensure_demo_adapters(base_model_dir, tmp_path, QUICK) == adapters


def test_changed_recipe_retrains(
    base_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ensure_demo_adapters(base_model_dir, tmp_path, QUICK)
    retrained: list[str] = []
    monkeypatch.setattr(demo_training, "train_adapter", lambda _b, name, *_a: retrained.append(name))
    ensure_demo_adapters(base_model_dir, tmp_path, TrainingRecipe(**{**QUICK.__dict__, "seed": 1}))
    assert retrained == ["pirate", "french"]


def validate_adapter_dir_without_stamp(path: Path, spec: BaseModelSpec) -> AdapterInfo:
    """The two files a tenant would upload (the training stamp is the demo's own bookkeeping)."""
    upload = path.parent / f"{path.name}-upload"
    upload.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (upload / name).write_bytes((path / name).read_bytes())
    return validate_adapter_dir(upload, spec, ValidationLimits())
