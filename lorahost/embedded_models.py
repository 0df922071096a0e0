"""`lorahost serve` serves every catalog base model (issue 24 item 5): one in-process worker per model, started
when requests wait for it and stopped when idle, within a memory budget.

The decision is scheduler/model_pool.py's (pure); this module observes and carries it out: every `poll_s` it
reads the catalog's live models that the native engine may serve, the requests held at the front door per base
model (the API's cold-start gauge), and each worker's running and queued requests (the worker directory), then
starts an `EmbeddedWorker` for a model (it fetches its files from the blob store by name, verified; it joins the
directory once loaded, and the held requests route to it) or drains and stops one. The configured model's worker
is the server's own: pinned, counted in the budget, never stopped here.
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
from registry.base_model_catalog import list_base_models
from scheduler.model_pool import PooledModel, PoolPlan, plan_model_pool
from settings import Settings

log = logging.getLogger("lorahost.embedded_models")

EMBEDDED_ENGINE = "native"


class ModelWorker(Protocol):
    """What the pool needs of a started worker (gpu_workers.worker.embedded.EmbeddedWorker)."""

    def stop(self, drain: bool = True) -> None:
        """Drain, deregister and stop."""
        ...


def start_embedded_worker(settings: Settings, directory: WorkerDirectory) -> ModelWorker:
    """An in-process worker for `settings.base_model_name`, loading in the background."""
    from gpu_workers.worker.embedded import EmbeddedWorker

    return EmbeddedWorker(settings, directory).start()


def directory_bytes(path: Path | None) -> int:
    """The size of a local model directory's files (0 when there is none)."""
    if path is None or not Path(path).is_dir():
        return 0
    return sum(p.stat().st_size for p in Path(path).iterdir() if p.is_file())


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
        self._pinned_bytes = directory_bytes(settings.base_model_path)
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
        """Observe, decide (scheduler/model_pool.py) and carry the plan out."""
        plan = plan_model_pool(
            self.observe(),
            budget_bytes=self.settings.worker.embedded_memory_bytes,
            idle_timeout_s=self.settings.worker.embedded_idle_s,
            now_s=self.clock(),
        )
        for name in plan.to_stop:
            log.info("base model %s: idle, stopping its in-process worker", name)
            worker = self.workers.pop(name)
            self._idle_since.pop(name, None)
            threading.Thread(target=worker.stop, name=f"lorahost-stop-{name}", daemon=True).start()
        for name in plan.to_start:
            log.info("base model %s: requests wait for it, starting an in-process worker", name)
            self.workers[name] = self.start_worker(self._worker_settings(name), self.directory)
        return plan

    def observe(self) -> list[PooledModel]:
        """The pool's view now: the pinned configured model and each live catalog model the native engine serves."""
        with self.session_factory() as session:
            catalog = {
                m.name: m.num_bytes
                for m in list_base_models(session)
                if EMBEDDED_ENGINE in (m.engines or [EMBEDDED_ENGINE])
            }
        waiting = self.waiting()
        active: dict[str, int] = {}
        for record in self.directory.list_live():
            active[record.base_model] = (
                active.get(record.base_model, 0) + record.num_running + record.num_waiting
            )
        pinned = self.settings.base_model_name
        models = [PooledModel(pinned, self._pinned_bytes, is_running=True, is_pinned=True)]
        now = self.clock()
        for name, num_bytes in sorted(catalog.items()):
            if name == pinned:
                continue
            is_running = name in self.workers
            num_waiting, num_active = waiting.get(name, 0), active.get(name, 0)
            if is_running and num_waiting == 0 and num_active == 0:
                self._idle_since.setdefault(name, now)
            else:
                self._idle_since.pop(name, None)
            models.append(
                PooledModel(
                    name,
                    num_bytes,
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
