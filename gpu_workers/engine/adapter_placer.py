"""Carries out the engine core's adapter decisions on the model runner: the device side of adapter residency.

The core (scheduler/core/: `AdapterResidency` over the `PagePool`, `BatchScheduler`) decides which adapters
are registered, which go to the device and which leave it; `AdapterPlacer` does it with tensors. It
registers an adapter's host copy with the residency (refusing one that could never fit the pool), places
an explicit load after the pool approved it (evicting idle adapters' device copies first), starts the
copies a step plan asks for (asynchronous, gpu_workers/engine/adapter_copier.py), reports the copies that landed
and drops evicted device copies. Failures of planned copies are returned to the engine, which ends that
adapter's requests.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from gpu_workers.engine.engine_stats import EngineCounters
from gpu_workers.engine.errors import AdapterCapacityError, AdapterInUseError, AdapterLoadError
from gpu_workers.engine.layers.lora import LoraAdapter
from gpu_workers.engine.model_runner import ModelRunner
from scheduler.core.adapter_residency import Residency
from scheduler.core.batch_scheduler import BatchScheduler
from scheduler.core.step_plan import StepPlan

CopyFailure = tuple[str, str]  # (adapter id, why its planned copy failed)


class AdapterPlacer:
    """The device side of the core's adapter plans, over one model runner."""

    def __init__(self, runner: ModelRunner, scheduler: BatchScheduler, counters: EngineCounters) -> None:
        self.runner = runner
        self.scheduler = scheduler
        self.residency = scheduler.residency
        self.pool = scheduler.pool
        self.counters = counters

    def register(
        self, adapter_id: str, host_path: str | None, rank: int, num_bytes: int, num_pages: int | None
    ) -> None:
        """Make a host copy known to the core; AdapterLoadError when it can never fit the page pool."""
        state = self.residency.register(adapter_id, host_path, rank, num_bytes, num_pages)
        num_pages = self.residency.num_pages_for(state)
        # Unified: its requests need at least one KV page beside it, or they could never run (and would wait
        # forever instead of being refused).
        room = self.pool.max_adapter_pages - (1 if self.pool.is_unified else 0)
        if num_pages > room:
            self.residency.forget(adapter_id)
            where = (
                "the pool leaves room for" if self.pool.is_unified else "the adapter share of the pool has"
            )
            raise AdapterLoadError(
                f"adapter {adapter_id!r} needs {num_pages} device pages but {where} {room}; raise "
                "engine_kv_cache_bytes / engine_adapter_cache_bytes or use a smaller rank"
            )

    def place(
        self,
        adapter_id: str,
        host_path: str | None,
        rank: int,
        num_bytes: int,
        num_pages: int | None,
        build: Callable[[], LoraAdapter],
        load_seconds: float | None = None,
    ) -> None:
        """Register, plan the load (pool first), drop the victims' copies, then build and place the tensors.

        AdapterInUseError when replacing an adapter that requests use, AdapterCapacityError when the adapters
        that would have to go are in use, AdapterLoadError when the build fails (the adapter stays on the
        host). `load_seconds`: how long building it took when the caller built it (else measured here).
        """
        if adapter_id in self.runner.adapters or adapter_id in self.runner.transfers.host_copies:
            if self.scheduler.is_adapter_in_use(adapter_id):
                raise AdapterInUseError(
                    f"adapter {adapter_id!r} is used by running or waiting requests; reload it after they finish"
                )
            self.runner.transfers.cancel_adapter_copy(adapter_id)
            self.residency.evict(adapter_id)
            self.drop_device_copy(adapter_id)
        self.register(adapter_id, host_path, rank, num_bytes, num_pages)
        plan = StepPlan()
        if not self.scheduler.plan_adapter_load(adapter_id, may_evict_waiting=False, plan=plan):
            raise AdapterCapacityError(
                f"no room for adapter {adapter_id!r}: the adapters on the device that would have to go are in "
                f"use ({len(self.residency.device_adapters())} on the device, {self.pool.num_free_pages} free "
                "pages); retry later (a request naming it waits for room instead) or raise "
                "engine_adapter_cache_bytes"
            )
        for victim in plan.adapter_evictions:
            self.drop_device_copy(victim)
        started = time.perf_counter()
        try:
            adapter = self.runner.transfers.place_adapter(build(), self._page_ids(adapter_id))
        except Exception as exc:
            self.scheduler.on_adapter_load_failed(adapter_id)
            self.counters.num_adapter_load_failures += 1
            raise AdapterLoadError(f"adapter {adapter_id!r} could not be put on the device: {exc}") from exc
        if load_seconds is None:
            load_seconds = time.perf_counter() - started
        self.runner.adapters[adapter_id] = adapter
        self.scheduler.on_adapter_loaded(adapter_id, load_seconds)

    def _page_ids(self, adapter_id: str) -> list[int]:
        """The pages the core reserved for the adapter (views of the KV cache in a unified pool)."""
        state = self.residency.get(adapter_id)
        return list(state.page_ids) if state is not None else []

    def carry_out(self, plan: StepPlan) -> list[CopyFailure]:
        """Drop evicted device copies, then start the planned copies (they land in `poll_copies`).

        Returns the copies that could not start (files changed or vanished): their adapters' requests fail.
        """
        for adapter_id in plan.adapter_evictions:
            self.drop_device_copy(adapter_id)
        failures = []
        for load in plan.adapter_loads:
            try:
                page_ids = self._page_ids(load.adapter_id)
                self.runner.transfers.start_adapter_copy(
                    load.adapter_id, Path(load.host_path or ""), page_ids
                )
            except Exception as exc:  # noqa: BLE001 (files changed or vanished: fail its requests only)
                failures.append((load.adapter_id, str(exc)))
        return failures

    def poll_copies(self) -> list[CopyFailure]:
        """Report the copies that landed to the core (their sequences use the device copy from now on);
        returns those that failed."""
        failures = []
        for job in self.runner.transfers.take_finished_copies():
            if self.residency.residency(job.adapter_id) is not Residency.COPYING:
                continue  # replaced meanwhile (install_adapter)
            if job.error is None:
                self.scheduler.on_adapter_loaded(job.adapter_id, job.seconds)
            else:
                failures.append((job.adapter_id, f"copy to the device failed: {job.error}"))
        return failures

    def drop_device_copy(self, adapter_id: str) -> None:
        """Cancel the adapter's copy and drop its device tensors (the core already freed its pages)."""
        self.runner.transfers.cancel_adapter_copy(adapter_id)
        self.runner.adapters.pop(adapter_id, None)
        self.runner.forget_adapter(adapter_id)
