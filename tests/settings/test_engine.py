"""The engine section is composed of one class per concern, and stays one flat section of engine_* names."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from settings import Settings
from settings.engine import (
    EngineBatchingSettings,
    EngineKernelSettings,
    EngineLoraSettings,
    EngineMemorySettings,
    EngineSettings,
    EngineVllmSettings,
)

CONCERNS: tuple[type[BaseModel], ...] = (
    EngineMemorySettings,
    EngineBatchingSettings,
    EngineLoraSettings,
    EngineKernelSettings,
    EngineVllmSettings,
)


def test_each_engine_setting_is_declared_by_exactly_one_concern() -> None:
    declared = [name for concern in CONCERNS for name in concern.model_fields]
    assert len(declared) == len(set(declared))
    assert set(declared) == set(EngineSettings.model_fields)


def test_the_composed_section_keeps_every_concerns_flat_names() -> None:
    for concern in CONCERNS:
        for name, info in concern.model_fields.items():
            assert EngineSettings.model_fields[name].validation_alias == info.validation_alias


@pytest.mark.parametrize(
    ("concern", "field", "value", "env"),
    [
        (EngineMemorySettings, "memory_mode", "x", "LORAHOST_ENGINE_MEMORY_MODE"),
        (EngineBatchingSettings, "max_num_seqs", 0, "LORAHOST_ENGINE_MAX_NUM_SEQS"),
        (EngineLoraSettings, "cpu_prefill_workers", -1, "LORAHOST_ENGINE_CPU_PREFILL_WORKERS"),
        (EngineKernelSettings, "decode_attention", "x", "LORAHOST_ENGINE_DECODE_ATTENTION"),
        (EngineKernelSettings, "cuda_graph_max_batch_size", 0, "LORAHOST_ENGINE_CUDA_GRAPH_MAX_BATCH_SIZE"),
        (EngineVllmSettings, "max_loras", 0, "LORAHOST_ENGINE_MAX_LORAS"),
    ],
)
def test_each_concern_checks_its_own_fields_and_names_the_variable(
    concern: type[BaseModel], field: str, value: object, env: str
) -> None:
    for build in (lambda: concern(**{field: value}), lambda: Settings(**{f"engine_{field}": value})):
        with pytest.raises(ValidationError, match=env):
            build()


def test_each_concerns_policies_are_the_composed_sections() -> None:
    engine = Settings(engine_batch_policy="multiqueue", adapter_eviction_policy="fastlibra").engine
    assert (
        engine.batch_policy_options()
        == EngineBatchingSettings(batch_policy="multiqueue").batch_policy_options()
    )
    assert type(engine.eviction_policy()) is type(
        EngineLoraSettings(adapter_eviction_policy="fastlibra").eviction_policy()
    )
