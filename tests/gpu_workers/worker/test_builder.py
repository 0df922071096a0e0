"""gpu_workers/worker/builder.py: the worker is built from Settings, and the backend is picked by name only there."""

from __future__ import annotations

import importlib.util
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_workers.engine.outputs import RequestOutput
from gpu_workers.worker import builder
from gpu_workers.worker.backend import InferenceBackend
from gpu_workers.worker.builder import BACKENDS, build_worker_service, make_runtime
from registry.storage import LocalBlobStore
from scheduler.core.engine_request import EngineRequest
from scheduler.core.engine_stats import EngineStats
from settings import Settings


class _FakeBackend:
    """A backend that is not the native engine (stands in for a later vLLM backend)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def generate_stream(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        raise NotImplementedError

    async def register_adapter(self, adapter_id: str, path: Path) -> None:
        return None

    def pin_adapter(self, adapter_id: str) -> None:
        return None

    def unpin_adapter(self, adapter_id: str) -> None:
        return None

    def adapter_residency(self, adapter_id: str) -> str:
        return "none"

    def device_adapters(self) -> list[str]:
        return []

    async def abort(self, request_id: str) -> None:
        return None

    async def load_adapter(self, adapter_id: str, path: Path) -> None:
        return None

    async def unload_adapter(self, adapter_id: str) -> None:
        return None

    def loaded_adapters(self) -> list[str]:
        return []

    def engine_stats(self) -> EngineStats:
        return EngineStats(max_model_len=128)

    def shutdown(self) -> None:
        return None


@pytest.fixture
def sock() -> Iterator[socket.socket]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s


def _settings(tmp_path: Path, **overrides: Any) -> Settings:
    return Settings(
        data_dir=tmp_path,
        blob_store=str(tmp_path / "blobs"),
        base_model_path=tmp_path / "model",
        internal_token="t",
        **overrides,
    )


def test_the_native_engine_is_the_default_backend() -> None:
    assert Settings().worker.backend == "native"
    assert "native" in BACKENDS


def test_an_unknown_backend_is_refused_before_the_worker_starts_naming_the_setting_and_choices(
    tmp_path: Path, sock: socket.socket
) -> None:
    with pytest.raises(ValueError, match=r"unknown worker backend 'nope'.*LORAHOST_WORKER_BACKEND.*native"):
        make_runtime(
            _settings(tmp_path, worker_backend="nope"),
            sock,
            None,
            "t",
            blobs=LocalBlobStore(tmp_path / "blobs"),
        )


def test_a_backend_registered_by_name_is_what_the_service_serves_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(builder, "BACKENDS", {**BACKENDS, "fake": _FakeBackend})
    settings = _settings(tmp_path, worker_backend="fake", engine_max_num_seqs=7)
    service = build_worker_service(settings, blobs=LocalBlobStore(tmp_path / "blobs"), worker_id="w1")
    assert isinstance(service.engine, _FakeBackend) and isinstance(service.engine, InferenceBackend)
    assert service.engine.settings is settings
    assert service.worker_id == "w1" and service.max_model_len == 128 and service.max_num_seqs == 7


def test_the_adapter_eviction_policy_setting_reaches_the_engine_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert builder.engine_config_from_settings(_settings(tmp_path)).adapter_eviction_policy == "lru"
    monkeypatch.setenv("LORAHOST_ADAPTER_EVICTION_POLICY", "fastlibra")
    settings = Settings(base_model_path=tmp_path)
    assert builder.engine_config_from_settings(settings).adapter_eviction_policy == "fastlibra"


def test_the_engine_rank_limit_is_its_own_setting_else_the_upload_limit(tmp_path: Path) -> None:
    assert (
        builder.engine_config_from_settings(Settings(base_model_path=tmp_path, max_rank=64)).max_lora_rank
        == 64
    )
    settings = Settings(base_model_path=tmp_path, max_rank=64, engine_max_lora_rank=16)
    assert builder.engine_config_from_settings(settings).max_lora_rank == 16


def test_an_unknown_adapter_eviction_policy_is_refused_naming_the_setting_and_choices(tmp_path: Path) -> None:
    from gpu_workers.engine.config import EngineConfig

    with pytest.raises(
        ValueError, match=r"'mru'.*LORAHOST_ADAPTER_EVICTION_POLICY.*chameleon, fastlibra, lru"
    ):
        Settings(data_dir=tmp_path, adapter_eviction_policy="mru")
    with pytest.raises(ValueError, match=r"adapter_eviction_policy must be one of .*'mru'"):
        EngineConfig(model_path=tmp_path, adapter_eviction_policy="mru")


def test_the_multiqueue_settings_reach_the_engine_config_and_its_policy(tmp_path: Path) -> None:
    from gpu_workers.engine.config import EngineConfig
    from scheduler.admission.batch_policy import make_batch_policy
    from scheduler.multiqueue.multiqueue import MultiQueuePolicy

    settings = _settings(
        tmp_path,
        engine_batch_policy="multiqueue",
        engine_multiqueue_slo_s=2.5,
        engine_multiqueue_refresh_s=60.0,
        engine_multiqueue_max_queues=3,
    )
    config = builder.engine_config_from_settings(settings)
    assert (
        config.batch_policy,
        config.multiqueue_slo_s,
        config.multiqueue_refresh_s,
        config.multiqueue_max_queues,
    ) == ("multiqueue", 2.5, 60.0, 3)
    policy = make_batch_policy(config.batch_policy, **config.batch_policy_options())
    assert isinstance(policy, MultiQueuePolicy) and (policy.slo_s, policy.refresh_s, policy.max_queues) == (
        2.5,
        60.0,
        3,
    )
    assert EngineConfig(model_path=tmp_path, batch_policy="sjf").batch_policy_options() == {}
    for name, value in (
        ("engine_multiqueue_slo_s", 0),
        ("engine_multiqueue_refresh_s", -1),
        ("engine_multiqueue_max_queues", 0),
    ):
        with pytest.raises(ValueError, match=name):
            Settings(data_dir=tmp_path, **{name: value})
    with pytest.raises(ValueError, match="multiqueue_max_queues must be positive"):
        EngineConfig(model_path=tmp_path, multiqueue_max_queues=0)


def test_the_adapter_cache_setting_reaches_the_engine_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert builder.engine_config_from_settings(_settings(tmp_path)).is_caching_idle_adapters is True
    monkeypatch.setenv("LORAHOST_ENGINE_ADAPTER_CACHE", "false")
    settings = Settings(base_model_path=tmp_path)
    assert builder.engine_config_from_settings(settings).is_caching_idle_adapters is False
    with pytest.raises(ValueError, match="engine_adapter_cache"):
        Settings(data_dir=tmp_path, engine_adapter_cache="sometimes")


def test_the_cpu_fast_path_settings_reach_the_engine_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    default = builder.engine_config_from_settings(_settings(tmp_path))
    assert default.fp32_prefill_gemms is None and default.lora_kernel is None  # auto
    monkeypatch.setenv("LORAHOST_ENGINE_FP32_PREFILL_GEMMS", "false")
    monkeypatch.setenv("LORAHOST_ENGINE_LORA_KERNEL", "false")
    config = builder.engine_config_from_settings(Settings(base_model_path=tmp_path))
    assert config.fp32_prefill_gemms is False and config.lora_kernel is False
    assert (config.prefill_gemm, config.decode_attention, config.decode_lora_form) == (
        None,
        None,
        None,
    )  # measured
    monkeypatch.setenv("LORAHOST_ENGINE_PREFILL_GEMM", "plain")
    monkeypatch.setenv("LORAHOST_ENGINE_DECODE_ATTENTION", "c_kernel")
    monkeypatch.setenv("LORAHOST_ENGINE_DECODE_LORA_FORM", "stacked")
    config = builder.engine_config_from_settings(Settings(base_model_path=tmp_path))
    assert (config.prefill_gemm, config.decode_attention, config.decode_lora_form) == (
        "plain",
        "c_kernel",
        "stacked",
    )
    monkeypatch.setenv("LORAHOST_ENGINE_DECODE_ATTENTION", "flash")
    with pytest.raises(ValueError, match="engine_decode_attention"):
        Settings(base_model_path=tmp_path)


def test_engine_backend_names_the_engine_and_wins_over_the_older_worker_backend() -> None:
    from gpu_workers.worker.builder import backend_factory, backend_name

    assert backend_name(Settings()) == "native"
    assert backend_name(Settings(worker_backend="native", engine_backend="vllm")) == "vllm"
    assert backend_factory(Settings(engine_backend="vllm")) is BACKENDS["vllm"]
    with pytest.raises(
        ValueError, match=r"backend must be one of \['native', 'vllm'\].*LORAHOST_ENGINE_BACKEND"
    ):
        Settings(engine_backend="tgi")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_the_vllm_backend_without_vllm_says_what_to_install(tmp_path: Path) -> None:
    settings = _settings(tmp_path, engine_backend="vllm")
    with pytest.raises(RuntimeError, match=r"needs the vllm package.*setup_vllm_venv\.sh"):
        BACKENDS["vllm"](settings)
