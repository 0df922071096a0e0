"""engine_max_running_tokens and engine_max_running_adapter_mib reach the engine's scheduler: off by default,
a bound when set."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_workers.engine.config import EngineConfig
from gpu_workers.engine.llm_engine import LLMEngine
from scheduler.core.engine_request import EngineRequest
from scheduler.core.sampling import SamplingParams


def test_engine_admits_a_second_request_only_within_the_running_token_bound(base_model_dir: Path) -> None:
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    for bound, expected_running in ((None, 2), (10, 1)):
        config = EngineConfig(
            model_path=base_model_dir, dtype="float32", num_kv_blocks=64, max_running_tokens=bound
        )
        engine = LLMEngine(config)
        assert engine.scheduler.running_budget.max_running_tokens == bound
        engine.add_request(EngineRequest("a", [1, 5, 9, 13, 17, 21], params))
        engine.add_request(EngineRequest("b", [1, 6, 10, 14, 18, 22], params))
        engine.step()
        assert len(engine.scheduler.running) == expected_running  # 6 + 6 tokens exceed a bound of 10


def test_engine_max_running_adapter_mib_reaches_the_scheduler_in_bytes(
    base_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from settings import Settings

    assert (
        EngineConfig(model_path=base_model_dir, num_kv_blocks=64).core_limits().max_running_adapter_bytes
        is None
    )
    monkeypatch.setenv("LORAHOST_ENGINE_MAX_RUNNING_ADAPTER_MIB", "256")
    assert Settings().engine.max_running_adapter_mib == 256
    config = EngineConfig(
        model_path=base_model_dir, dtype="float32", num_kv_blocks=64, max_running_adapter_mib=3
    )
    engine = LLMEngine(config)
    assert engine.scheduler.running_budget.max_running_adapter_bytes == 3 * 2**20
