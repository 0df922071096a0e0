"""The garbage collector of a served API process: full collections that scan what is new, not every stream alive.

CPython (3.11) runs a full collection, generation 2, with every thread stopped, whenever the objects promoted into
generation 2 since the last one exceed a quarter of those it kept then, and it scans every object there. The
startup heap (~220,000 objects: imports, the app, its services) is frozen once the app has started (`gc.freeze`),
but the objects of the streams in flight are not: while streams open, their objects are promoted and a full
collection runs at every 25% growth of them, each scanning them all. Measured at 2,000 streams over two replicas
(benchmarks/RESULTS.md): three full collections per replica in a 10 s ramp, 55-217 ms each, each a stall of every
request and token of that replica; the p99 of the platform's TTFT.

So `ServingHeap` also freezes what survived each full collection, right after it: the next full collection scans
only what was promoted since, a pause bounded by the allocations between two collections, not by the streams
alive. A frozen object is still freed by reference counting when its last reference goes, as almost every object
of a request is (cyclic garbage measured at 0.3 objects per request); only reference cycles that became garbage
after they were frozen wait, for a sweep: everything unfrozen, collected and frozen again, from the event loop
(`tend`), once the objects frozen since the last sweep exceed `max_frozen_growth` times those frozen at it. So
cyclic garbage held back is at most that many times the heap kept at the last sweep, and a sweep's pause (a scan of
everything) comes once per that much promotion, not at every 25%.

One per process: the collector's callbacks, its frozen generation and its thresholds are per process. Started only
by the served process (api/http_server.py); an app run by a test client leaves the collector as it is.
"""

from __future__ import annotations

import asyncio
import bisect
import gc
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

MAX_FROZEN_GROWTH = 2.0
SWEEP_CHECK_INTERVAL_S = 1.0
GC_PAUSE_BUCKETS_MS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0)
NUM_GENERATIONS = 3


class ServingHeap:
    """A process's collector policy (module doc) and the pauses of its collections, per generation."""

    def __init__(self, max_frozen_growth: float = MAX_FROZEN_GROWTH) -> None:
        self.max_frozen_growth = max_frozen_growth
        self.num_frozen_at_sweep = 0
        self.num_frozen_since_sweep = 0
        self.num_sweeps = 0
        self.is_sweep_due = False
        self.is_started = False
        # cumulative, per generation: counts per GC_PAUSE_BUCKETS_MS bucket (+ one for larger pauses), sum in ms;
        # written only by the collector's callback (no lock: a lock taken inside a collection can deadlock)
        self.pause_counts = [[0] * (len(GC_PAUSE_BUCKETS_MS) + 1) for _ in range(NUM_GENERATIONS)]
        self.pause_sums_ms = [0.0] * NUM_GENERATIONS
        self._started_at = 0.0
        self._is_sweeping = False

    def start(self) -> None:
        """Collect the garbage there is, freeze what is alive, and from now on freeze what each full collection
        keeps. Once per process."""
        if self.is_started:
            raise RuntimeError("the serving heap is already started")
        self.sweep()
        gc.callbacks.append(self._on_collection)
        self.is_started = True

    def stop(self) -> None:
        """Stop freezing after full collections (what is frozen stays frozen)."""
        if self.is_started:
            gc.callbacks.remove(self._on_collection)
            self.is_started = False

    def sweep(self) -> None:
        """A full collection of everything, frozen included, then everything alive frozen again."""
        self._is_sweeping = True
        try:
            gc.unfreeze()
            gc.collect()
            gc.freeze()
        finally:
            self._is_sweeping = False
        self.num_frozen_at_sweep = gc.get_freeze_count()
        self.num_frozen_since_sweep = 0
        self.is_sweep_due = False
        self.num_sweeps += 1

    async def tend(self, check_interval_s: float = SWEEP_CHECK_INTERVAL_S) -> None:
        """Sweep when due, checked every `check_interval_s` on the event loop, until cancelled (a sweep cannot run
        inside the collection that finds it due)."""
        while True:
            await asyncio.sleep(check_interval_s)
            if self.is_sweep_due:
                self.sweep()

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started_at = time.perf_counter()
            return
        generation = int(info["generation"])
        self._observe_pause(generation, (time.perf_counter() - self._started_at) * 1000)
        if generation != NUM_GENERATIONS - 1 or self._is_sweeping:
            return
        # a full collection has just merged every younger generation into the oldest: what is there survived it
        self.num_frozen_since_sweep += len(gc.get_objects(generation=NUM_GENERATIONS - 1))
        gc.freeze()
        if self.num_frozen_since_sweep > self.max_frozen_growth * self.num_frozen_at_sweep:
            self.is_sweep_due = True

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
