"""Adapter loads off the step loop (the mechanism behind the core's PREPARING and COPYING states).

A load has two stages, each on a background thread of its own, so the engine thread never waits on a cold
adapter: the preparer thread makes its host copy (`prepare`: read, validate and pack its files; skipped when
the host tier holds the copy), then the copy thread (the link) copies it to the device. Each stage serves
its jobs in order (a host-tier hit goes straight to the link; a prepared copy joins the link's queue when
its preparation ends), so a preparation overlaps the copy before it. On CUDA a copy runs on a side stream
from pinned host memory and the copy thread waits on its event; on a CPU device the "device copy" is a
clone. `link_gbps` (GB/s, 10^9 bytes per second) emulates a slower link: a copy of n bytes lands no earlier
than n / (link_gbps * 1e9) seconds after it started, so the cost of cold adapters is real and measurable on
a CPU-only machine (None: as fast as the machine).

The engine thread starts loads and takes their results (`take_prepared`, then `take_finished`); the worker
threads only fill in a job's fields and set its events.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from gpu_workers.engine.layers.lora import LoraAdapter, map_lora_tensors
from gpu_workers.engine.thread_limits import limit_this_thread


@dataclass
class CopyJob:
    """One adapter's load. `prepared` is set when its host copy is ready (`host_copy`) or its preparation
    failed (`error`, no copy follows); `done` when the copy landed (`device_copy`) or failed (`error`)."""

    adapter_id: str
    host_copy: LoraAdapter | None = None  # given at start (host tier) or made by `prepare`
    prepare: Callable[[], LoraAdapter] | None = None  # makes the host copy (preparer thread)
    place: Callable[[LoraAdapter], LoraAdapter] | None = None  # writes into reserved device memory
    device_copy: LoraAdapter | None = None
    error: str | None = None
    prepare_seconds: float = 0.0  # making the host copy (0 from the host tier)
    seconds: float = 0.0  # from the start of the transfer to landing
    is_cancelled: bool = False
    is_prepare_taken: bool = False  # engine thread: `take_prepared` returned it
    prepared: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def is_from_host_tier(self) -> bool:
        """True when the host copy was given at start (nothing was read or packed)."""
        return self.prepare is None


class AdapterCopier:
    """Starts loads, reports the host copies made and the copies that landed or failed; thread-safe."""

    def __init__(self, device: torch.device, link_gbps: float | None = None) -> None:
        if link_gbps is not None and link_gbps <= 0:
            raise ValueError(f"link_gbps must be positive or None, got {link_gbps}")
        self.device = device
        self.link_gbps = link_gbps
        self._jobs: dict[str, CopyJob] = {}
        self._prepare_queue: queue.SimpleQueue[CopyJob] = queue.SimpleQueue()
        self._copy_queue: queue.SimpleQueue[CopyJob] = queue.SimpleQueue()
        self._changed = threading.Condition()  # notified when a job is prepared or done
        self._threads: list[threading.Thread] = []
        self.num_copies = 0
        self.copy_seconds = 0.0
        self.max_copy_seconds = 0.0

    # ---- engine thread ------------------------------------------------------------------------------

    def start(
        self,
        adapter_id: str,
        *,
        host_copy: LoraAdapter | None = None,
        prepare: Callable[[], LoraAdapter] | None = None,
        place: Callable[[LoraAdapter], LoraAdapter] | None = None,
    ) -> None:
        """Queue an adapter's load (replacing an unfinished load of the same id): from its `host_copy`, or
        from the host copy `prepare` makes on the preparer thread (exactly one of the two).

        `place`: copies the host tensors into device memory reserved for them (the adapter's pages of the
        unified pool) and returns the adapter as views there; None: the copy allocates tensors of its own.
        """
        if (host_copy is None) == (prepare is None):
            raise ValueError("give exactly one of host_copy and prepare")
        self.cancel(adapter_id)
        job = CopyJob(adapter_id, host_copy, prepare, place)
        self._jobs[adapter_id] = job
        self._start_threads()
        if host_copy is None:
            self._prepare_queue.put(job)
            return
        job.prepared.set()
        self._copy_queue.put(job)

    def _start_threads(self) -> None:
        if self._threads:
            return
        for target, name in ((self._run_prepares, "adapter-preparer"), (self._run_copies, "adapter-copier")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def cancel(self, adapter_id: str) -> None:
        """Forget an unfinished load (its results are dropped; a copy not started yet never starts)."""
        job = self._jobs.pop(adapter_id, None)
        if job is not None:
            job.is_cancelled = True

    def landed(self, adapter_id: str, wait: bool = False) -> LoraAdapter | None:
        """The device copy once the copy landed, else None (wait=True: block until it landed or failed; only
        for a load whose host copy is ready)."""
        job = self._jobs.get(adapter_id)
        if job is None:
            return None
        if wait:
            job.done.wait()
        return job.device_copy if job.done.is_set() else None

    def has_in_flight(self) -> bool:
        """True while a started load has not been taken by `take_finished` (or failed in `take_prepared`)."""
        return bool(self._jobs)

    def wait_any(self, timeout: float) -> None:
        """Block until some load has a result to take (host copy made, copy done) or `timeout` seconds
        passed."""
        with self._changed:
            if not any(self._has_news(j) for j in self._jobs.values()):
                self._changed.wait(timeout)

    @staticmethod
    def _has_news(job: CopyJob) -> bool:
        return job.done.is_set() if job.is_prepare_taken else job.prepared.is_set()

    def take_prepared(self) -> list[CopyJob]:
        """Return the loads whose host copy was made (their copy runs on) or failed since the last call; the
        failed ones are removed (reported here only)."""
        prepared = [j for j in self._jobs.values() if not j.is_prepare_taken and j.prepared.is_set()]
        for job in prepared:
            job.is_prepare_taken = True
            if job.host_copy is None:
                del self._jobs[job.adapter_id]
        return prepared

    def take_finished(self) -> list[CopyJob]:
        """Remove and return the copies that landed or failed since the last call (of loads `take_prepared`
        returned)."""
        finished = [j for j in self._jobs.values() if j.is_prepare_taken and j.done.is_set()]
        for job in finished:
            del self._jobs[job.adapter_id]
            if job.error is None:
                self.num_copies += 1
                self.copy_seconds += job.seconds
                self.max_copy_seconds = max(self.max_copy_seconds, job.seconds)
        return finished

    # ---- preparer thread ----------------------------------------------------------------------------

    def _run_prepares(self) -> None:
        limit_this_thread(1)
        while True:
            job = self._prepare_queue.get()
            prepare = job.prepare
            if job.is_cancelled or prepare is None:
                continue
            started = time.perf_counter()
            try:
                job.host_copy = prepare()
            except Exception as exc:  # noqa: BLE001 (reported to the engine, which fails that adapter's requests)
                job.error = f"{type(exc).__name__}: {exc}"
            job.prepare_seconds = time.perf_counter() - started
            if job.host_copy is not None and not job.is_cancelled:
                self._copy_queue.put(job)
            self._notify(job.prepared)

    def _notify(self, event: threading.Event) -> None:
        with self._changed:
            event.set()
            self._changed.notify_all()

    # ---- copy thread --------------------------------------------------------------------------------

    def _run_copies(self) -> None:
        limit_this_thread(1)
        while True:
            job = self._copy_queue.get()
            if job.is_cancelled or job.host_copy is None:
                continue
            started = time.perf_counter()
            try:
                device_copy = self.copy(job.host_copy, job.place)
                if self.link_gbps is not None:
                    link_seconds = job.host_copy.num_bytes / (self.link_gbps * 1e9)
                    time.sleep(max(0.0, started + link_seconds - time.perf_counter()))
                job.device_copy = device_copy
            except Exception as exc:  # noqa: BLE001 (reported to the engine, which fails that adapter's requests)
                job.error = f"{type(exc).__name__}: {exc}"
            job.seconds = time.perf_counter() - started
            self._notify(job.done)

    def copy(
        self, host_copy: LoraAdapter, place: Callable[[LoraAdapter], LoraAdapter] | None = None
    ) -> LoraAdapter:
        """The device copy of a host copy (blocking; runs on the copy thread). With `place`, the tensors go
        into reserved device memory (pages no sequence holds, so the engine thread never touches them
        while the copy runs)."""
        if self.device.type != "cuda":
            return place(host_copy) if place is not None else map_lora_tensors(host_copy, torch.Tensor.clone)
        stream = torch.cuda.Stream(self.device)
        main_stream = torch.cuda.default_stream(self.device)

        def to_device(t: torch.Tensor) -> torch.Tensor:
            d = t.to(self.device, non_blocking=True)
            d.record_stream(main_stream)  # used on the engine's stream after landing
            return d

        with torch.cuda.stream(stream):
            device_copy = place(host_copy) if place is not None else map_lora_tensors(host_copy, to_device)
            event = torch.cuda.Event()
            event.record(stream)
        event.synchronize()
        return device_copy


def pin_host_copy(adapter: LoraAdapter) -> LoraAdapter:
    """Page-locked host tensors (async DMA on CUDA); unchanged when there is no CUDA."""
    if not torch.cuda.is_available():
        return adapter
    return map_lora_tensors(adapter, torch.Tensor.pin_memory)
