"""Explicit adapter loads on the model runner: the device side of `LLMEngine.register_adapter` /
`load_adapter` / `install_adapter`.

The core (scheduler/core/: `AdapterResidency` over the `PagePool`, `BatchScheduler`) decides which adapters
are registered, which go to the device and which leave it. `AdapterPlacer` registers an adapter's host copy
with the residency (refusing one that could never fit the pool) and places an explicit load after the pool
approved it (dropping the evicted adapters' device copies first). The copies a step plan asks for are
carried out by the engine core itself over its executor (scheduler/core/engine_core.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gpu_workers.engine.errors import AdapterCapacityError, AdapterInUseError, AdapterLoadError
from gpu_workers.engine.layers.lora import LoraAdapter
from gpu_workers.engine.model_runner import ModelRunner
from scheduler.core.adapter_residency import Residency
from scheduler.core.engine_core import EngineCore
from scheduler.core.step_plan import StepPlan


class AdapterPlacer:
    """Explicit adapter loads through the core's plan, over one model runner."""

    def __init__(self, runner: ModelRunner, core: EngineCore) -> None:
        self.runner = runner
        self.core = core
        self.scheduler = core.scheduler
        self.residency = core.residency
        self.pool = core.pool
        self.counters = core.counters

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
        is_loading = self.residency.residency(adapter_id) in (Residency.PREPARING, Residency.COPYING)
        if adapter_id in self.runner.adapters or is_loading:
            if self.scheduler.is_adapter_in_use(adapter_id):
                raise AdapterInUseError(
                    f"adapter {adapter_id!r} is used by running or waiting requests; reload it after they finish"
                )
            self.runner.transfers.cancel_adapter_copy(adapter_id)
            self.residency.evict(adapter_id)
            self.runner.drop_adapter(adapter_id)
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
            self.runner.drop_adapter(victim)
        if plan.kv_block_moves:  # before the adapter is written into their old pages
            self.runner.move_kv_blocks(plan.kv_block_moves)
            self.counters.record_kv_block_moves(len(plan.kv_block_moves))
        started = time.perf_counter()
        try:
            adapter = self.runner.transfers.place_adapter(build(), self.core.page_ids(adapter_id))
        except Exception as exc:
            self.scheduler.on_adapter_load_failed(adapter_id)
            self.counters.num_adapter_load_failures += 1
            raise AdapterLoadError(f"adapter {adapter_id!r} could not be put on the device: {exc}") from exc
        if load_seconds is None:
            load_seconds = time.perf_counter() - started
        self.runner.adapters[adapter_id] = adapter
        self.scheduler.on_adapter_loaded(adapter_id, load_seconds)
