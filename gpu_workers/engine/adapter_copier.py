"""Asynchronous host -> device adapter copies (the mechanism behind the core's COPYING state).

One background thread is the link: copies queue on it in start order. On CUDA a copy runs on a side
stream from pinned host memory and the thread waits on its event, so the engine thread never blocks on
it; on a CPU device the "device copy" is a clone. `link_gbps` (GB/s, 10^9 bytes per second) emulates a
slower link: a copy of n bytes lands no earlier than n / (link_gbps * 1e9) seconds after it started, so
the cost of cold adapters is real and measurable on a CPU-only machine (None: as fast as the machine).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from gpu_workers.engine.layers.lora import LoraAdapter, map_lora_tensors


@dataclass
class CopyJob:
    """One adapter's copy; `done` is set when it landed (`device_copy`) or failed (`error`)."""

    adapter_id: str
    host_copy: LoraAdapter
    place: Callable[[LoraAdapter], LoraAdapter] | None = None  # writes into reserved device memory
    device_copy: LoraAdapter | None = None
    error: str | None = None
    seconds: float = 0.0  # from the start of the transfer to landing
    is_cancelled: bool = False
    done: threading.Event = field(default_factory=threading.Event)


class AdapterCopier:
    """Starts copies, reports the ones that landed or failed; thread-safe."""

    def __init__(self, device: torch.device, link_gbps: float | None = None) -> None:
        if link_gbps is not None and link_gbps <= 0:
            raise ValueError(f"link_gbps must be positive or None, got {link_gbps}")
        self.device = device
        self.link_gbps = link_gbps
        self._jobs: dict[str, CopyJob] = {}
        self._queue: queue.SimpleQueue[CopyJob] = queue.SimpleQueue()
        self._finished = threading.Condition()
        self._thread: threading.Thread | None = None
        self.num_copies = 0
        self.copy_seconds = 0.0
        self.max_copy_seconds = 0.0

    # ---- engine thread ------------------------------------------------------------------------------

    def start(
        self, host_copy: LoraAdapter, place: Callable[[LoraAdapter], LoraAdapter] | None = None
    ) -> None:
        """Queue the copy of an adapter's host copy (replacing an unfinished copy of the same id).

        `place`: copies the host tensors into device memory reserved for them (the adapter's pages of the
        unified pool) and returns the adapter as views there; None: the copy allocates tensors of its own.
        """
        self.cancel(host_copy.adapter_id)
        job = CopyJob(host_copy.adapter_id, host_copy, place)
        self._jobs[job.adapter_id] = job
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="adapter-copier", daemon=True)
            self._thread.start()
        self._queue.put(job)

    def cancel(self, adapter_id: str) -> None:
        """Forget an unfinished copy (its result is dropped)."""
        job = self._jobs.pop(adapter_id, None)
        if job is not None:
            job.is_cancelled = True

    def landed(self, adapter_id: str, wait: bool = False) -> LoraAdapter | None:
        """The device copy once the copy landed, else None (wait=True: block until it landed or failed)."""
        job = self._jobs.get(adapter_id)
        if job is None:
            return None
        if wait:
            job.done.wait()
        return job.device_copy if job.done.is_set() else None

    def has_in_flight(self) -> bool:
        """True while a started copy has not been taken by `take_finished`."""
        return bool(self._jobs)

    def wait_any(self, timeout: float) -> None:
        """Block until some copy finished or `timeout` seconds passed."""
        with self._finished:
            if not any(j.done.is_set() for j in self._jobs.values()):
                self._finished.wait(timeout)

    def take_finished(self) -> list[CopyJob]:
        """Remove and return the copies that landed or failed since the last call."""
        finished = [j for j in self._jobs.values() if j.done.is_set()]
        for job in finished:
            del self._jobs[job.adapter_id]
            if job.error is None:
                self.num_copies += 1
                self.copy_seconds += job.seconds
                self.max_copy_seconds = max(self.max_copy_seconds, job.seconds)
        return finished

    # ---- copy thread --------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job.is_cancelled:
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
            with self._finished:
                job.done.set()
                self._finished.notify_all()

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
