"""`lorahost serve` serves every catalog base model (issue 24 item 5): one in-process worker per model, started
when requests wait for it and stopped when idle, within a memory budget.

The decision is scheduler/scaling/model_pool.py's (pure); this module observes and carries it out: every `poll_s` it
reads the catalog's live models that the native engine may serve, the requests held at the front door per base
model (the API's cold-start gauge), and each worker's running and queued requests (the worker directory), then
starts an `EmbeddedWorker` for a model (it fetches its files from the blob store by name, verified; it joins the
directory once loaded, and the held requests route to it) or drains and stops one. The configured model's worker
is the server's own: pinned, counted in the budget, never stopped here.

Memory (issue 33 item 4; lorahost/worker_memory.py): every worker is counted whole (weights, KV and adapter
pools, host adapter tier, activations) against one budget (LORAHOST_WORKER_EMBEDDED_MEMORY_BYTES, default a share
of the machine's memory); a catalog model's worker starts with its pools sized to what the policy grants it (what
is left of the budget, down to its smallest pools), and a model that cannot start is published in `refusals`
(cluster/model_refusals.py) so its held requests are refused with a 503 saying what to change, or told why they
waited.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from sqlalchemy.orm import Session, sessionmaker

from cluster.membership import WorkerDirectory
from cluster.model_refusals import ModelRefusal, ModelStartRefusals
from lorahost.worker_memory import (
    ModelSizing,
    ReadText,
    embedded_budget_bytes,
    engine_element_size,
    read_text,
    sized_settings,
)
from registry.base_model_catalog import list_base_models
from scheduler.scaling.model_pool import BlockedModel, PooledModel, PoolPlan, plan_model_pool
from scheduler.scaling.worker_footprint import WorkerFootprint, gib
from settings import Settings

log = logging.getLogger("lorahost.embedded_models")

EMBEDDED_ENGINE = "native"


class ModelWorker(Protocol):
    """What the pool needs of a started worker (gpu_workers.worker.embedded.EmbeddedWorker)."""

    def stop(self, drain: bool = True) -> None:
        """Drain, deregister and stop."""
        ...


def start_embedded_worker(settings: Settings, directory: WorkerDirectory) -> ModelWorker:
    """An in-process worker for `settings.base_model_name`, loading in the background from the configured blob
    store."""
    from gpu_workers.worker.embedded import EmbeddedWorker
    from registry.blob_locations import make_blob_store

    return EmbeddedWorker(settings, directory, blobs=make_blob_store(settings)).start()


class ModelTooLarge(ValueError):
    """The configured base model's smallest worker does not fit the in-process workers' memory budget."""


def pinned_footprint(
    settings: Settings, budget_bytes: int | None, element_size: int
) -> WorkerFootprint | None:
    """The configured model's worker footprint within the budget, at least its smallest (None without a local
    model directory)."""
    if settings.base_model_path is None or not Path(settings.base_model_path).is_dir():
        return None
    sizing = ModelSizing.from_model_dir(settings.base_model_path, element_size)
    return sizing.fit(settings, element_size, budget_bytes) or sizing.smallest(settings, element_size)


def size_pinned_worker(
    settings: Settings, budget_bytes: int | None, element_size: int | None = None
) -> tuple[Settings, WorkerFootprint | None]:
    """The configured model's worker settings with its pools sized to fit the budget, and its footprint (None
    without a local model directory); ModelTooLarge saying what to change when even its smallest pools do not fit."""
    if settings.base_model_path is None or not Path(settings.base_model_path).is_dir():
        return settings, None
    element_size = element_size or engine_element_size(settings)
    sizing = ModelSizing.from_model_dir(settings.base_model_path, element_size)
    footprint = sizing.fit(settings, element_size, budget_bytes)
    if footprint is None:
        smallest = sizing.smallest(settings, element_size)
        raise ModelTooLarge(
            f"the configured base model needs at least {smallest.describe()} but the in-process workers' memory "
            f"budget is {gib(budget_bytes or 0)}: raise LORAHOST_WORKER_EMBEDDED_MEMORY_BYTES (or "
            "LORAHOST_WORKER_EMBEDDED_MEMORY_FRACTION), or lower LORAHOST_ENGINE_MAX_NUM_BATCHED_TOKENS"
        )
    return sized_settings(settings, footprint), footprint


def refusal_of(blocked: BlockedModel, smallest: WorkerFootprint | None) -> ModelRefusal:
    """The message a held request for a model that cannot start gets (what to change, or why it waited)."""
    needs = smallest.describe() if smallest is not None else gib(blocked.min_bytes)
    budget = gib(blocked.budget_bytes)
    if blocked.is_final:
        return ModelRefusal(
            f"base model {blocked.name!r} cannot be served by this server: its smallest worker needs {needs}, "
            f"more than the in-process workers' memory budget of {budget} leaves beside the configured model; "
            "ask the operator to raise LORAHOST_WORKER_EMBEDDED_MEMORY_BYTES (or "
            "LORAHOST_WORKER_EMBEDDED_MEMORY_FRACTION) or to serve it on a worker of its own",
            is_final=True,
        )
    return ModelRefusal(
        f"base model {blocked.name!r} waits for memory: its smallest worker needs {needs} and busy models leave "
        f"{gib(max(blocked.room_bytes, 0))} of the {budget} budget; retry once their requests finish",
        is_final=False,
    )


class EmbeddedModelPool:
    """The in-process workers of the catalog's models (module doc); `step()` is one decision, carried out."""

    def __init__(
        self,
        settings: Settings,
        directory: WorkerDirectory,
        session_factory: sessionmaker[Session],
        waiting: Callable[[], dict[str, int]],
        *,
        start_worker: Callable[[Settings, WorkerDirectory], ModelWorker] = start_embedded_worker,
        clock: Callable[[], float] = time.monotonic,
        poll_s: float = 0.5,
        refusals: ModelStartRefusals | None = None,
        pinned: WorkerFootprint | None = None,
        read_memory: ReadText = read_text,
    ) -> None:
        self.settings = settings
        self.directory = directory
        self.session_factory = session_factory
        self.waiting = waiting
        self.start_worker = start_worker
        self.clock = clock
        self.poll_s = poll_s
        self.workers: dict[str, ModelWorker] = {}
        self._idle_since: dict[str, float] = {}
        self.refusals = refusals if refusals is not None else ModelStartRefusals()
        self.budget_bytes = embedded_budget_bytes(settings, read_memory)
        self.element_size = engine_element_size(settings)
        if (
            pinned is None
        ):  # the configured model's worker as `lorahost serve` sizes it (at least its smallest)
            pinned = pinned_footprint(settings, self.budget_bytes, self.element_size)
        self.pinned = pinned
        self.footprints: dict[str, WorkerFootprint] = {}  # each started catalog worker's, as sized
        self._sizings: dict[str, ModelSizing] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lorahost-model-pool", daemon=True)

    def start(self) -> EmbeddedModelPool:
        """Decide every poll_s in a background thread."""
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop deciding, then drain and stop every worker the pool started."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        for name in list(self.workers):
            self.workers.pop(name).stop()

    def step(self) -> PoolPlan:
        """Observe, decide (scheduler/scaling/model_pool.py) and carry the plan out."""
        plan = plan_model_pool(
            self.observe(),
            budget_bytes=self.budget_bytes,
            idle_timeout_s=self.settings.worker.embedded_idle_s,
            now_s=self.clock(),
        )
        for name in plan.to_stop:
            log.info("base model %s: idle, stopping its in-process worker", name)
            worker = self.workers.pop(name)
            self._idle_since.pop(name, None)
            self.footprints.pop(name, None)
            threading.Thread(target=worker.stop, name=f"lorahost-stop-{name}", daemon=True).start()
        for name in plan.to_start:
            self._start(name, plan.granted(name))
        self.refusals.replace({b.name: self._refusal(b) for b in plan.blocked})
        return plan

    def used_bytes(self) -> int:
        """The memory the running workers hold (the pinned one's included), as counted against the budget."""
        pinned = self.pinned.num_bytes if self.pinned is not None else 0
        return pinned + sum(f.num_bytes for f in self.footprints.values())

    def _start(self, name: str, granted: int | None) -> None:
        footprint = self._sizings[name].fit(self.settings, self.element_size, granted)
        if footprint is None:  # the policy granted at least the smallest size: not reached
            raise RuntimeError(f"base model {name}: {granted} bytes granted, below its smallest worker")
        self.footprints[name] = footprint
        budget = "unbounded" if self.budget_bytes is None else gib(self.budget_bytes)
        log.info(
            "base model %s: requests wait for it, starting an in-process worker of %s; the workers now hold "
            "%s of the %s budget",
            name,
            footprint.describe(),
            gib(self.used_bytes()),
            budget,
        )
        worker_settings = sized_settings(self._worker_settings(name), footprint)
        self.workers[name] = self.start_worker(worker_settings, self.directory)

    def _refusal(self, blocked: BlockedModel) -> ModelRefusal:
        sizing = self._sizings.get(blocked.name)
        refusal = refusal_of(blocked, sizing.smallest(self.settings, self.element_size) if sizing else None)
        log.warning("%s", refusal.message)
        return refusal

    def observe(self) -> list[PooledModel]:
        """The pool's view now: the pinned configured model and each live catalog model the native engine serves."""
        with self.session_factory() as session:
            catalog = {
                m.name: ModelSizing.from_catalog(m.shape, m.dtype, m.files, self.element_size)
                for m in list_base_models(session)
                if EMBEDDED_ENGINE in (m.engines or [EMBEDDED_ENGINE])
            }
        self._sizings = catalog
        waiting = self.waiting()
        active: dict[str, int] = {}
        for record in self.directory.list_live():
            active[record.base_model] = (
                active.get(record.base_model, 0) + record.scheduler.num_running + record.scheduler.num_waiting
            )
        pinned = self.settings.base_model_name
        pinned_bytes = self.pinned.num_bytes if self.pinned is not None else 0
        models = [PooledModel(pinned, pinned_bytes, is_running=True, is_pinned=True)]
        now = self.clock()
        for name, sizing in sorted(catalog.items()):
            if name == pinned:
                continue
            is_running = name in self.workers
            num_waiting, num_active = waiting.get(name, 0), active.get(name, 0)
            if is_running and num_waiting == 0 and num_active == 0:
                self._idle_since.setdefault(name, now)
            else:
                self._idle_since.pop(name, None)
            full = self.footprints.get(name) or sizing.full(self.settings, self.element_size)
            models.append(
                PooledModel(
                    name,
                    full.num_bytes,
                    min_bytes=sizing.smallest(self.settings, self.element_size).num_bytes,
                    is_running=is_running,
                    num_waiting=num_waiting,
                    num_active=num_active,
                    idle_since_s=self._idle_since.get(name),
                )
            )
        return models

    def _worker_settings(self, name: str) -> Settings:
        """The configured settings for a worker of catalog model `name`: its files from the blob store, its own
        id, port and adapter file cache."""
        home = self.settings.data_dir / "workers" / name
        worker_settings = self.settings.updated(
            base_model_name=name,
            worker_id=f"embedded-{name}",
            worker_port=0,
            worker_advertise_url=None,
            host_cache_dir=home / "host_cache",
        )
        return worker_settings.model_copy(update={"base_model_path": None})

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.step()
            except Exception:  # the pool keeps deciding; the next poll retries
                log.exception("the embedded model pool could not decide; retrying")
