"""The garbage collector of a served API process: cyclic garbage collected young, old objects never scanned
until the heap has doubled.

CPython (3.11) collects generation 2 with every thread stopped whenever the objects promoted there since the last
full collection exceed a quarter of those it kept then, and it scans every object there. The startup heap (~220,000
objects: imports, the app, its services) is frozen once the app has started (`gc.freeze`), but the objects of the
streams in flight are not: while streams open, their objects are promoted and full collections run, each scanning
them all. Measured at 2,000 streams over two replicas (benchmarks/RESULTS.md): three full collections per replica
in a 10 s ramp, 55-217 ms each, each a stall of every request and token of that replica: the p99 of TTFT. Freezing
what each full collection kept left three per ramp, 50-100 ms each (tens of thousands of objects of the streams
opened since the last one).

So `ServingHeap` freezes what survives right after every collection, the youngest generation's included: the older
generations stay empty and a collection scans the objects made since the last one only (cycles among them are
collected as before). Freezing only what collections of generation 1 or 2 kept (before the twentieth pass) left a
collection of generation 1 every ten young ones over what they had kept meanwhile: at 2,000 streams, ~8,000 objects
(the live coroutines, futures and buffers of the streams opened since), 5 ms of CPU on average and up to 15 ms
each, 95-100 per replica and phase, 10-26 of them stopping the event loop over 10 ms; freezing after the young
collections too left none, with 3-7% less of the replicas' CPU per unit of work and the same peak RSS
(benchmarks/RESULTS.md).

A frozen object is still freed by reference counting when its last reference goes, as almost every object of a
request is (cyclic garbage measured at 0.3 objects per request); only reference cycles that became garbage
after they were frozen wait, for a sweep: everything unfrozen, collected and frozen again, from the event loop
(`tend`), once the process's allocated blocks (`sys.getallocatedblocks`, every small object alive or in a cycle
waiting) exceed `1 + max_heap_growth` times those after the last sweep: Go's GOGC rule (collect when the heap has
grown by that fraction since the last collection left it), so cyclic garbage held back is bounded by that growth
and a sweep's pause (a scan of everything) comes once per that much growth.

The youngest generation is also collected on a timer (`tend`, every 0.1 s). CPython collects it when allocations
minus deallocations pass 700, so while old objects die as fast as new ones are made (a stream's objects for one
token replace those for the last) it is not collected while it grows: 27,000 objects measured at 1,000 waiting
streams, 10-20 ms to collect, one pause a second in whichever thread (the usage writer's checkpoint, mostly) then
allocated. Collected ten times a second it stays a tenth of that.

One per process: the collector's callbacks and its frozen generation are per process. Started only by the served
process (api/http_server.py); an app run by a test client leaves the collector as it is.
"""

from __future__ import annotations

import asyncio
import bisect
import gc
import sys
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

MAX_HEAP_GROWTH = 1.0  # GOGC=100
SWEEP_CHECK_INTERVAL_S = 1.0
YOUNG_INTERVAL_S = 0.1
GC_PAUSE_BUCKETS_MS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0)
NUM_GENERATIONS = 3


class ServingHeap:
    """A process's collector policy (module doc) and the pauses of its collections, per generation."""

    def __init__(self, max_heap_growth: float = MAX_HEAP_GROWTH, is_freezing_promoted: bool = True) -> None:
        self.max_heap_growth = max_heap_growth
        # False: the startup heap frozen and pauses counted only (a process with an engine in it: a frozen cycle
        # holding tensors would hold memory that the allocated blocks do not count)
        self.is_freezing_promoted = is_freezing_promoted
        self.num_blocks_at_sweep = 0
        self.num_sweeps = 0
        self.is_started = False
        # cumulative, per generation: counts per GC_PAUSE_BUCKETS_MS bucket (+ one for larger pauses), sum in ms;
        # written only by the collector's callback (no lock: a lock taken inside a collection can deadlock)
        self.pause_counts = [[0] * (len(GC_PAUSE_BUCKETS_MS) + 1) for _ in range(NUM_GENERATIONS)]
        self.pause_sums_ms = [0.0] * NUM_GENERATIONS
        self._started_at = 0.0
        self._is_sweeping = False

    def start(self) -> None:
        """Collect the garbage there is, freeze what is alive, and from now on freeze what each collection keeps.
        Once per process."""
        if self.is_started:
            raise RuntimeError("the serving heap is already started")
        self.sweep()
        gc.callbacks.append(self._on_collection)
        self.is_started = True

    def stop(self) -> None:
        """Stop freezing after collections (what is frozen stays frozen)."""
        if self.is_started:
            gc.callbacks.remove(self._on_collection)
            self.is_started = False

    @property
    def is_sweep_due(self) -> bool:
        """The heap has grown past its bound since the last sweep."""
        return sys.getallocatedblocks() > (1 + self.max_heap_growth) * self.num_blocks_at_sweep

    def sweep(self) -> None:
        """A full collection of everything, frozen included, then everything alive frozen again."""
        self._is_sweeping = True
        try:
            gc.unfreeze()
            gc.collect()
            gc.freeze()
        finally:
            self._is_sweeping = False
        self.num_blocks_at_sweep = sys.getallocatedblocks()
        self.num_sweeps += 1

    async def tend(
        self, check_interval_s: float = SWEEP_CHECK_INTERVAL_S, young_interval_s: float = YOUNG_INTERVAL_S
    ) -> None:
        """On the event loop until cancelled: the youngest generation collected every `young_interval_s`, and a
        sweep when due, checked every `check_interval_s` (a sweep cannot run inside a collection)."""
        loop = asyncio.get_running_loop()
        next_check = loop.time() + check_interval_s
        while True:
            await asyncio.sleep(young_interval_s)
            if not self.is_started:
                continue
            gc.collect(0)
            if loop.time() >= next_check:
                next_check = loop.time() + check_interval_s
                if self.is_freezing_promoted and self.is_sweep_due:
                    self.sweep()

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started_at = time.perf_counter()
            return
        generation = int(info["generation"])
        self._observe_pause(generation, (time.perf_counter() - self._started_at) * 1000)
        if self.is_freezing_promoted and not self._is_sweeping:
            # the younger generations were merged into this one and its survivors promoted to the next: freezing
            # them keeps the older generations empty, so no collection but a sweep scans them again
            gc.freeze()

    def _observe_pause(self, generation: int, pause_ms: float) -> None:
        self.pause_counts[generation][bisect.bisect_left(GC_PAUSE_BUCKETS_MS, pause_ms)] += 1
        self.pause_sums_ms[generation] += pause_ms


class GcPauseCollector(Collector):
    """lorahost_gc_pause_ms{generation}: how long each garbage collection held the process (every thread), read
    from a ServingHeap at scrape time."""

    def __init__(self, heap: ServingHeap) -> None:
        self._heap = heap

    def collect(self) -> Iterator[HistogramMetricFamily]:
        """The pause histogram of each generation."""
        family = HistogramMetricFamily(
            "lorahost_gc_pause_ms",
            "How long each garbage collection stopped the process, every thread (ms; api/serving_heap.py)",
            labels=["generation"],
        )
        for generation in range(NUM_GENERATIONS):
            counts = list(self._heap.pause_counts[generation])
            bounds = [*(str(bound) for bound in GC_PAUSE_BUCKETS_MS), "+Inf"]
            cumulative = [sum(counts[: i + 1]) for i in range(len(counts))]
            family.add_metric(
                [str(generation)],
                list(zip(bounds, cumulative, strict=True)),
                self._heap.pause_sums_ms[generation],
            )
        yield family
