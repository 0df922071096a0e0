"""The garbage collector policy of a served API process (api/serving_heap.py): what every collection keeps is
frozen after it, cyclic garbage among frozen objects waits for a sweep, a sweep falls due once the
heap has grown past its bound, and every collection's pause is counted per generation."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from api.metrics import ApiMetrics
from api.serving_heap import GC_PAUSE_BUCKETS_MS, ServingHeap
from tests.api.conftest import ADMIN


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture
def heaps() -> Iterator[list[ServingHeap]]:
    made: list[ServingHeap] = []
    yield made
    for heap in made:
        heap.stop()
    gc.unfreeze()  # the rest of the test process collects as before


def _heap(heaps: list[ServingHeap], max_heap_growth: float = 1.0) -> ServingHeap:
    heap = ServingHeap(max_heap_growth)
    heaps.append(heap)
    heap.start()
    return heap


def _is_collectable(obj: object) -> bool:
    return any(o is obj for o in gc.get_objects())


@pytest.mark.parametrize("generation", [0, 1, 2])
def test_what_a_collection_keeps_is_frozen_after_it(heaps: list[ServingHeap], generation: int) -> None:
    _heap(heaps)
    kept = [Node() for _ in range(100)]
    assert _is_collectable(kept[0])
    num_frozen = gc.get_freeze_count()
    gc.collect(generation)
    assert not _is_collectable(kept[0])
    assert gc.get_freeze_count() >= num_frozen + 100


def test_a_young_collection_scans_only_what_was_made_since_the_last_one(heaps: list[ServingHeap]) -> None:
    """The older generations stay empty: a collection of generation 1 finds nothing older to scan."""
    _heap(heaps)
    kept = [Node() for _ in range(100)]
    gc.collect(0)
    newer = [Node() for _ in range(10)]
    assert gc.get_objects(1) == [] and gc.get_objects(2) == []
    assert _is_collectable(newer[0]) and not _is_collectable(kept[0])


def test_frozen_objects_are_still_freed_by_reference_counting(heaps: list[ServingHeap]) -> None:
    _heap(heaps)
    node = Node()
    ref = weakref.ref(node)
    gc.collect()
    assert not _is_collectable(node)
    del node
    assert ref() is None


def test_a_frozen_cycle_that_became_garbage_is_collected_by_the_next_sweep(heaps: list[ServingHeap]) -> None:
    heap = _heap(heaps)
    a, b = Node(), Node()
    a.other, b.other = b, a
    ref = weakref.ref(a)
    gc.collect()  # a and b alive: frozen
    del a, b
    gc.collect()
    assert ref() is not None  # out of the collector's reach until a sweep
    heap.sweep()
    assert ref() is None


def test_a_sweep_falls_due_once_the_heap_has_grown_past_its_bound(heaps: list[ServingHeap]) -> None:
    heap = _heap(heaps, max_heap_growth=0.05)
    assert not heap.is_sweep_due
    grown = [Node() for _ in range(int(0.1 * heap.num_blocks_at_sweep))]  # a block each at least
    assert heap.is_sweep_due
    heap.sweep()
    assert not heap.is_sweep_due and heap.num_blocks_at_sweep > len(grown)


def test_a_stopped_heap_freezes_nothing_more(heaps: list[ServingHeap]) -> None:
    heap = _heap(heaps)
    heap.stop()
    kept = [Node() for _ in range(10)]
    gc.collect()
    assert _is_collectable(kept[0])


def test_a_process_starts_its_heap_once(heaps: list[ServingHeap]) -> None:
    heap = _heap(heaps)
    with pytest.raises(RuntimeError):
        heap.start()


def test_tending_sweeps_when_a_sweep_is_due(heaps: list[ServingHeap]) -> None:
    heap = _heap(heaps, max_heap_growth=0.05)
    assert heap.num_sweeps == 1  # at start
    grown = [Node() for _ in range(int(0.1 * heap.num_blocks_at_sweep))]

    async def tend_until_swept() -> None:
        tending = asyncio.create_task(heap.tend(check_interval_s=0.01))
        try:
            while heap.num_sweeps < 2:
                await asyncio.sleep(0.01)
        finally:
            tending.cancel()

    asyncio.run(asyncio.wait_for(tend_until_swept(), timeout=30))
    assert not heap.is_sweep_due and heap.num_blocks_at_sweep > len(grown)


def test_each_collection_s_pause_is_exported_per_generation(heaps: list[ServingHeap]) -> None:
    heap = _heap(heaps)
    gc.collect(0)
    gc.collect(2)
    gc.collect(2)
    metrics = ApiMetrics()
    metrics.register_gc_pauses(heap)
    samples = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            samples[(s.name, s.labels.get("generation"), s.labels.get("le"))] = s.value
    assert samples[("lorahost_gc_pause_ms_count", "2", None)] >= 2
    assert samples[("lorahost_gc_pause_ms_count", "0", None)] >= 1
    assert samples[("lorahost_gc_pause_ms_sum", "2", None)] > 0
    # cumulative buckets, the last holding every pause
    counts = [samples[("lorahost_gc_pause_ms_bucket", "2", str(b))] for b in GC_PAUSE_BUCKETS_MS]
    assert counts == sorted(counts)
    assert (
        samples[("lorahost_gc_pause_ms_bucket", "2", "+Inf")]
        == samples[("lorahost_gc_pause_ms_count", "2", None)]
    )


def test_a_served_app_s_metrics_include_its_heap_s_pauses(make_client: Callable[..., TestClient]) -> None:
    heap = ServingHeap()  # not started: a test process keeps its collector as it is
    heap.pause_counts[2][-1] += 1  # one pause longer than the last bound, as a started heap would count it
    heap.pause_sums_ms[2] += 2500.0
    client = make_client(serving_heap=heap)
    text = client.get("/metrics", headers=ADMIN).text
    samples = {
        (s.name, s.labels.get("generation")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("lorahost_gc_pause_ms") and "le" not in s.labels
    }
    assert samples[("lorahost_gc_pause_ms_count", "2")] == 1
    assert samples[("lorahost_gc_pause_ms_sum", "2")] == 2500.0
    assert samples[("lorahost_gc_pause_ms_count", "0")] == 0


def test_an_app_not_served_has_no_heap_metrics(client: TestClient) -> None:
    assert "lorahost_gc_pause_ms" not in client.get("/metrics", headers=ADMIN).text


def test_a_heap_that_does_not_freeze_promoted_objects_freezes_the_startup_heap_and_counts_pauses(
    heaps: list[ServingHeap],
) -> None:
    heap = ServingHeap(is_freezing_promoted=False)
    heaps.append(heap)
    heap.start()
    assert gc.get_freeze_count() > 1000
    kept = [Node() for _ in range(100)]
    gc.collect()
    assert _is_collectable(kept[0])
    assert sum(heap.pause_counts[2]) == 1


def test_tending_collects_the_youngest_generation_on_a_timer(heaps: list[ServingHeap]) -> None:
    heap = _heap(heaps)
    a, b = Node(), Node()
    a.other, b.other = b, a
    ref = weakref.ref(a)
    del a, b
    num_young = sum(heap.pause_counts[0])

    async def tend_until_collected() -> None:
        tending = asyncio.create_task(heap.tend(young_interval_s=0.01))
        try:
            while ref() is not None:
                await asyncio.sleep(0.01)
        finally:
            tending.cancel()

    gc.disable()  # no collection but the timer's
    try:
        asyncio.run(asyncio.wait_for(tend_until_collected(), timeout=30))
    finally:
        gc.enable()
    assert sum(heap.pause_counts[0]) > num_young
