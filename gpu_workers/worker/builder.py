"""Building a worker from Settings: the backend, the service, the membership directory and the runtime.

The only place that picks the inference backend: `BACKENDS` maps a name (`settings.worker.backend`,
LORAHOST_WORKER_BACKEND; default "native") to a factory returning an `InferenceBackend`
(gpu_workers/worker/backend.py). A new backend (e.g. vLLM) is one module implementing that protocol plus one entry
here; the runtime, the HTTP app and the server do not change.

The blob store is injected: `build_worker_service` and `make_runtime` take a `BlobSource` (blob_source.py)
that the composition root built from Settings, and wire its `download_to` into the host adapter cache and the
base model fetch; nothing here imports a blob store.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from cluster.membership import InMemoryWorkerDirectory, WorkerDirectory
from gpu_workers.worker.backend import InferenceBackend
from gpu_workers.worker.blob_source import BlobSource, read_blob
from gpu_workers.worker.runtime import WorkerRuntime
from gpu_workers.worker.worker_service import WorkerService
from settings import Settings

if TYPE_CHECKING:
    from gpu_workers.engine.config import EngineConfig

BackendFactory = Callable[[Settings], InferenceBackend]
"""Builds a loaded backend from the worker's settings (blocking: it loads the base model)."""


def _native_backend(settings: Settings) -> InferenceBackend:
    """The native engine (engine.py) behind its loop thread (async_engine.py)."""
    from gpu_workers.engine.async_engine import AsyncLLMEngine

    return AsyncLLMEngine.from_config(engine_config_from_settings(settings))


def _vllm_backend(settings: Settings) -> InferenceBackend:
    """vLLM's AsyncLLM behind the platform's admission (vllm_backend.py); vllm is imported only here."""
    from gpu_workers.worker.vllm_engine import build_vllm_backend

    return build_vllm_backend(settings)


BACKENDS: Mapping[str, BackendFactory] = MappingProxyType({"native": _native_backend, "vllm": _vllm_backend})


def backend_name(settings: Settings) -> str:
    """The engine behind the worker: engine_backend when set, else worker_backend (its older name)."""
    return settings.engine.backend or settings.worker.backend


def backend_factory(settings: Settings) -> BackendFactory:
    """The factory named by backend_name(settings); ValueError naming the choices when it is unknown."""
    name = backend_name(settings)
    factory = BACKENDS.get(name)
    if factory is None:
        raise ValueError(
            f"unknown worker backend {name!r}: set LORAHOST_WORKER_BACKEND to one of "
            f"{', '.join(sorted(BACKENDS))}"
        )
    return factory


def build_worker_service(settings: Settings, *, blobs: BlobSource, worker_id: str) -> WorkerService:
    """Load the base model into the configured backend and wire the host cache to the blob store `blobs`
    (blocking)."""
    from gpu_workers.worker.host_cache import HostAdapterCache

    build_backend = backend_factory(settings)
    settings = with_local_base_model(settings, blobs)
    host_cache = HostAdapterCache(
        settings.resolved_host_cache_dir(),
        blobs.download_to,
        max_bytes=settings.worker.host_cache_max_bytes,
    )
    return WorkerService(
        build_backend(settings),
        host_cache,
        worker_id=worker_id,
        base_model=settings.base_model_name,
        max_num_seqs=settings.engine.max_num_seqs,
        perf_model=load_perf_profile(settings),
    )


def with_local_base_model(settings: Settings, blobs: BlobSource) -> Settings:
    """The settings with a local base model directory: LORAHOST_BASE_MODEL_PATH when set (development), else
    base model `base_model_name` fetched from the blob store's catalog into DATA_DIR/base-models
    (gpu_workers/worker/base_model_fetch.py; BaseModelFetchError saying what to do when it cannot be)."""
    from gpu_workers.worker.base_model_fetch import fetch_base_model
    from registry.base_model_manifest import manifest_key

    if settings.base_model_path is not None:
        return settings
    name = settings.base_model_name
    root = settings.data_dir / "base-models"
    path = fetch_base_model(name, lambda: read_blob(blobs, manifest_key(name)), blobs.download_to, root)
    return settings.model_copy(update={"base_model_path": path})


def load_perf_profile(settings: Settings) -> dict[str, Any] | None:
    """The model of the profile at settings.worker.profile_path (what heartbeats publish: the fit, not the raw
    samples), or None when unset; ValueError saying what to do when it cannot be read."""
    from scheduler.routing.perf_model import PerfModel

    path = settings.worker.profile_path
    if path is None:
        return None
    try:
        model = PerfModel.from_dict(json.loads(Path(path).read_text()))
    except (OSError, ValueError, AttributeError) as exc:
        raise ValueError(
            f"cannot use the worker profile {path}: {exc}; write one with `lorahost profile --output {path}` "
            "or unset LORAHOST_WORKER_PROFILE_PATH"
        ) from exc
    return model.to_dict()


def engine_config_from_settings(settings: Settings) -> EngineConfig:
    """The frozen EngineConfig of the native engine: the settings' engine section for the base model and the
    adapter rank limit."""
    from gpu_workers.engine.config import EngineConfig

    if settings.base_model_path is None:
        raise ValueError("no base model: set LORAHOST_BASE_MODEL_PATH or pass --base-model")
    return EngineConfig.from_section(
        settings.engine, model_path=settings.base_model_path, max_lora_rank=settings.resolved_max_lora_rank()
    )


def advertise_url(settings: Settings, port: int) -> str:
    """The URL API servers use: settings.worker.advertise_url, else http://<host>:<port>."""
    if settings.worker.advertise_url:
        return settings.worker.advertise_url.rstrip("/")
    host = settings.worker.host
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    return f"http://{host}:{port}"


def make_directory(settings: Settings) -> WorkerDirectory:
    """RedisWorkerDirectory when settings.storage.redis_url is set, else a process-local in-memory one."""
    if not settings.storage.redis_url:
        return InMemoryWorkerDirectory()
    import redis

    from cluster.membership import RedisWorkerDirectory

    return RedisWorkerDirectory(
        redis.Redis.from_url(settings.storage.redis_url), key_prefix=settings.worker.key_prefix
    )


def make_runtime(
    settings: Settings,
    sock: socket.socket,
    directory: WorkerDirectory | None,
    internal_token: str,
    *,
    blobs: BlobSource,
) -> WorkerRuntime:
    """A runtime for a worker listening on `sock` (its id defaults to <hostname>-<port>) whose service reads
    adapter and base model files from `blobs`.

    An unknown settings.worker.backend or an unreadable worker_profile_path fails here, before the server
    starts, not later in /ready.
    """
    backend_factory(settings)
    load_perf_profile(settings)  # a bad profile fails here too, not in /ready
    port = sock.getsockname()[1]
    worker_id = settings.worker.id or f"{socket.gethostname()}-{port}"
    return WorkerRuntime(
        lambda: build_worker_service(settings, blobs=blobs, worker_id=worker_id),
        internal_token=internal_token,
        url=advertise_url(settings, port),
        directory=directory,
        heartbeat_interval_s=settings.worker.heartbeat_interval_s,
        heartbeat_ttl_s=settings.worker.resolved_heartbeat_ttl_s(),
        drain_timeout_s=settings.worker.drain_timeout_s,
        stream_keepalive_s=settings.worker.stream_keepalive_s,
    )
