"""The worker's host tier of adapters: fetch and verify files, register them with the engine, lease them.

`AdapterManager` fetches and verifies an adapter version's files into the `HostAdapterCache` (single-flight:
concurrent first requests for one adapter share one fetch + registration task) and registers them with the
engine (validated, nothing on the device); the engine core (scheduler/core/) owns device memory, plans each
adapter's copy to the device before its request's first step and decides what is evicted. A request leases
its adapter (and its host-cache entry) from admission until its stream ends, so neither is evicted under it.
Everything here runs on the worker's event loop; blocking work goes to threads.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from cluster.protocol import AdapterRef
from gpu_workers.engine.errors import AdapterCapacityError, AdapterInUseError, AdapterNotLoadedError
from gpu_workers.worker.backend import InferenceBackend
from gpu_workers.worker.host_cache import AdapterFiles, HostAdapterCache
from gpu_workers.worker.worker_errors import AdapterUnavailableError
from scheduler.core.engine_stats import EngineStats

# An engine's residencies of an adapter on the device or planned there (a request for it is a cache hit).
LOADED_OR_LOADING = ("device", "copying", "preparing")


@dataclass
class AdapterCounters:
    """Cumulative adapter residency counters (reported in stats and heartbeats)."""

    num_cache_hits: int = (
        0  # the adapter was on the device (or being copied there) when a request asked for it
    )
    num_cache_misses: int = 0  # it was not: the request waits for the engine's planned copy
    num_adapter_unloads: int = 0
    num_load_failures: int = 0  # fetch, verification or registration failures (the engine counts its copies')


class AdapterManager:
    """The worker's host tier: fetches and verifies adapter files (single-flight), registers them with the
    engine and leases them for requests. What is on the device is the engine core's decision (its page pool
    and residency); this class keeps no device state of its own."""

    def __init__(self, engine: InferenceBackend, host_cache: HostAdapterCache) -> None:
        self._engine = engine
        self._host_cache = host_cache
        self._leases: dict[str, int] = {}
        self._registering: dict[str, asyncio.Task[None]] = {}
        self._refs: dict[str, AdapterRef] = {}  # every adapter seen (for host residency)
        self.counters = AdapterCounters()

    async def acquire(self, ref: AdapterRef) -> str:
        """Have the adapter's verified files on the host and registered with the engine, then lease it;
        returns the engine adapter id (= adapter_key). Nothing is copied to the device here: the engine
        plans that before the request's first step. AdapterUnavailableError when the files cannot be
        fetched, verified or validated."""
        key = ref.adapter_key
        cache_key = adapter_files(ref).cache_key
        self._host_cache.pin(cache_key)  # the engine reads the files when it copies them to the device
        try:
            await self._ensure_registered(ref)
        except BaseException:
            self._host_cache.unpin(cache_key)
            raise
        self._leases[key] = self._leases.get(key, 0) + 1
        self._engine.pin_adapter(key)
        return key

    def release(self, key: str) -> None:
        """End one lease (the engine may evict the adapter, the host cache its files, when nothing else
        uses them)."""
        count = self._leases.get(key, 0) - 1
        if count < 0:
            return
        if count > 0:
            self._leases[key] = count
        else:
            self._leases.pop(key, None)
        self._engine.unpin_adapter(key)
        self._host_cache.unpin(adapter_files(self._refs[key]).cache_key)

    async def prefetch(self, ref: AdapterRef) -> str:
        """Put the adapter on the device now if the pool has room (a hint: when the adapters that would
        have to go are in use, it stays registered on the host and a request copies it later); returns
        its residency afterwards."""
        key = await self.acquire(ref)
        try:
            if self._engine.adapter_residency(key) not in LOADED_OR_LOADING:
                path = self._host_cache.path_for(adapter_files(ref).cache_key)
                try:
                    await self._engine.load_adapter(key, path)
                except AdapterCapacityError:
                    pass
                except Exception as exc:  # the host copy changed meanwhile: the same answer as a request's
                    self.counters.num_load_failures += 1
                    raise AdapterUnavailableError(
                        f"adapter {key} could not be loaded by this worker: {exc}"
                    ) from exc
        finally:
            self.release(key)
        return self.residency(key)

    async def _ensure_registered(self, ref: AdapterRef) -> None:
        key = ref.adapter_key
        self._refs[key] = ref
        task = self._registering.get(key)
        is_on_device = self._engine.adapter_residency(key) in LOADED_OR_LOADING
        if is_on_device:
            self.counters.num_cache_hits += 1
        else:
            self.counters.num_cache_misses += 1
        if task is None and is_on_device and self._host_cache.contains(adapter_files(ref).cache_key):
            return
        if task is None:
            task = asyncio.ensure_future(self._register(ref))
            self._registering[key] = task
            task.add_done_callback(lambda _: self._registering.pop(key, None))
        await asyncio.shield(task)  # one waiter's cancellation must not cancel the shared registration

    async def _register(self, ref: AdapterRef) -> None:
        path = await self._fetch(ref)
        try:
            await self._engine.register_adapter(ref.adapter_key, path)
        except Exception as exc:  # invalid files: report them, keep serving
            self.counters.num_load_failures += 1
            raise AdapterUnavailableError(
                f"adapter {ref.adapter_key} could not be loaded by this worker: {exc}"
            ) from exc

    async def _fetch(self, ref: AdapterRef) -> Any:
        try:
            return await asyncio.to_thread(self._host_cache.get, adapter_files(ref))
        except Exception as exc:  # missing blob, checksum mismatch, I/O: all unavailable
            self.counters.num_load_failures += 1
            raise AdapterUnavailableError(
                f"adapter {ref.adapter_key} files could not be fetched or verified: {exc}"
            ) from exc

    async def drop(self, key: str) -> bool:
        """Unload an adapter now unless requests use it; True if it was unloaded."""
        if self._leases.get(key):
            return False
        try:
            await self._engine.unload_adapter(key)
        except (AdapterInUseError, AdapterNotLoadedError):
            return False
        self.counters.num_adapter_unloads += 1
        return True

    def device_adapters(self, engine_stats: EngineStats | None = None) -> list[str]:
        """Adapter keys on the engine's device, least recently used first (from `engine_stats` if given)."""
        if engine_stats is not None:
            return list(engine_stats.device_adapters)
        return self._engine.device_adapters()

    def host_adapters(self, device: list[str] | None = None) -> list[str]:
        """Adapter keys whose files are in the host cache but which are not on the device."""
        on_device = set(self.device_adapters() if device is None else device)
        return sorted(
            k
            for k, ref in self._refs.items()
            if k not in on_device and self._host_cache.contains(adapter_files(ref).cache_key)
        )

    def known_ranks(self) -> dict[str, int]:
        """The rank the API sent for every adapter whose files are in the host cache (AdapterRef.rank)."""
        return {k: self._refs[k].rank for k in self.host_adapters([]) if self._refs[k].rank > 0}

    def residency(self, key: str) -> str:
        """ "device", "copying", "preparing", "host" or "none"."""
        residency = self._engine.adapter_residency(key)
        if residency != "none":
            return residency
        return "host" if key in self.host_adapters() else "none"


def adapter_files(ref: AdapterRef) -> AdapterFiles:
    """The host cache's view of an adapter version: its blobs and the digests both files must have."""
    return AdapterFiles(
        version_key=ref.adapter_key,
        weights_sha256=ref.sha256,
        config_sha256=ref.config_sha256,
        config_blob_key=ref.config_blob_key,
        weights_blob_key=ref.weights_blob_key,
        owner_id=ref.owner_id,
    )
