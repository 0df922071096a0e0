"""Planner fixtures: the shipped H100 profile, the default engine settings and a surrogate trained on a few
short twin runs (cached per test session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from settings.engine import EngineSettings
from twin.planner.profile_lookup import resolve_profile
from twin.planner.surrogate import Surrogate, TrainingConfig, training_samples
from twin.profile import TwinProfile

SMALL_TRAINING = TrainingConfig(num_samples=24, duration_s=4.0, seed=1)


@pytest.fixture(scope="session")
def h100() -> TwinProfile:
    return resolve_profile("h100-llama3.1-8b-vllm")


@pytest.fixture(scope="session")
def engine() -> EngineSettings:
    return EngineSettings()


@pytest.fixture(scope="session")
def training_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("planner-cache")


@pytest.fixture(scope="session")
def small_surrogate(h100: TwinProfile, engine: EngineSettings, training_dir: Path) -> Surrogate:
    return Surrogate(training_samples(h100, engine, SMALL_TRAINING, cache_dir=training_dir))
