"""The engine core's step loop over a scripted executor (no tensors): tokens, stops, times, adapter loads
whose host copy is prepared (or not) and whose copy lands (or fails), rows without a token, aborts. The
native engine runs the same loop over its model runner (tests/gpu_workers/engine/); the digital twin over its
simulated executor (tests/twin/)."""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from scheduler.admission.batch_policy import FifoPolicy
from scheduler.core.adapter_residency import Residency
from scheduler.core.engine_core import CoreLimits, EngineCore
from scheduler.core.engine_stats import ExecutorStats
from scheduler.core.executor import CopyResult, PrepareResult
from scheduler.core.memory_geometry import MemoryGeometry, ModelShape
from scheduler.core.sequence import BatchEntry, Sequence
from tests.scheduler.core.scheduler_helpers import ManualClock, make_seq

SHAPE = ModelShape(2, 64, 4, 2, 16, 176, 512, 1024)


@dataclass
class ScriptedExecutor:
    """Samples `token` for every row (None for the request ids in `failing_rows`); host copies are ready and
    copies land when the test says so; records what the core asked of it."""

    geometry: MemoryGeometry
    token: int = 7
    failing_rows: set[str] = field(default_factory=set)
    copies: dict[str, list[int]] = field(default_factory=dict)
    prepared: list[PrepareResult] = field(default_factory=list)
    finished: list[CopyResult] = field(default_factory=list)
    refused_copies: set[str] = field(default_factory=set)
    dropped: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    steps: list[list[tuple[str, int]]] = field(default_factory=list)
    moves: list[list[tuple[int, int]]] = field(default_factory=list)

    def run_step(self, entries: list[BatchEntry], host_assisted: AbstractSet[str]) -> list[int | None]:
        self.steps.append([(e.seq.request_id, e.num_new_tokens) for e in entries])
        return [
            None if e.seq.request_id in self.failing_rows else self.token for e in entries if e.is_sampling
        ]

    def move_kv_blocks(self, moves: list[tuple[int, int]]) -> None:
        self.moves.append(list(moves))

    def start_adapter_copy(self, adapter_id: str, host_path: str | None, page_ids: list[int]) -> None:
        if adapter_id in self.refused_copies:
            raise FileNotFoundError(f"{host_path} vanished")
        self.copies[adapter_id] = page_ids

    def prepare(self, adapter_id: str, error: str | None = None, is_from_host_tier: bool = False) -> None:
        if error is not None:
            self.copies.pop(adapter_id)
        self.prepared.append(PrepareResult(adapter_id, 0.25, error, is_from_host_tier))

    def land(self, adapter_id: str, error: str | None = None) -> None:
        self.copies.pop(adapter_id)
        self.finished.append(CopyResult(adapter_id, 0.5, error))

    def take_prepared_copies(self) -> list[PrepareResult]:
        done, self.prepared = self.prepared, []
        return done

    def take_finished_copies(self) -> list[CopyResult]:
        done, self.finished = self.finished, []
        return done

    def has_copies_in_flight(self) -> bool:
        return bool(self.copies)

    def wait_for_copy(self, timeout_s: float) -> None:
        pass

    def drop_adapter(self, adapter_id: str) -> None:
        self.dropped.append(adapter_id)

    def release_request(self, request_id: str) -> None:
        self.released.append(request_id)

    def stats(self) -> ScriptedExecutorStats:
        return ScriptedExecutorStats(num_copies_started=len(self.copies))


class ScriptedExecutorStats(ExecutorStats):
    num_copies_started: int = 0


def _core(clock: ManualClock, **limits: Any) -> tuple[EngineCore, ScriptedExecutor]:
    geometry = MemoryGeometry.plan(
        SHAPE,
        element_size=4,
        block_size=4,
        memory_mode="unified",
        kv_cache_bytes=0,
        num_kv_blocks=64,
        max_lora_rank=8,
    )
    executor = ScriptedExecutor(geometry)
    limits = {"max_num_seqs": 8, "max_num_batched_tokens": 64, "enable_prefix_caching": False} | limits
    core = EngineCore(executor, FifoPolicy(), CoreLimits(**limits), clock=clock, step_timer=clock)
    return core, executor


def _run(core: EngineCore, clock: ManualClock, num_steps: int) -> list[tuple[str, list[int], bool]]:
    out = []
    for _ in range(num_steps):
        clock.now += 1.0
        out.extend((d.seq.request_id, d.new_token_ids, d.seq.is_finished) for d in core.step())
    return out


def test_prefill_then_decode_until_the_length_stop_with_times_from_the_clock() -> None:
    clock = ManualClock(now=10.0)
    core, executor = _core(clock)
    seq = make_seq("r", num_prompt=5, max_tokens=3, adapter_id=None, arrival=10.0)
    core.add(seq)
    deltas = _run(core, clock, 4)
    assert deltas == [("r", [7], False), ("r", [7], False), ("r", [7], True)]
    assert executor.steps == [[("r", 5)], [("r", 1)], [("r", 1)]]
    assert (seq.first_scheduled_time, seq.first_token_time, seq.finish_time) == (11.0, 11.0, 13.0)
    assert seq.finish_reason == "length" and executor.released == ["r"]
    stats = core.stats()
    assert (stats.num_steps, stats.num_output_tokens, stats.num_prompt_tokens) == (3, 3, 5)
    assert isinstance(stats.executor, ScriptedExecutorStats)
    assert (
        stats.num_finished == 1 and stats.executor.num_copies_started == 0 and stats.memory_mode == "unified"
    )


def test_a_request_waits_for_its_adapter_copy_and_runs_once_it_landed() -> None:
    clock = ManualClock()
    core, executor = _core(clock)
    core.residency.register("a", "/host/a", 4, 2000)
    core.add(make_seq("r", 4, 1, "a", 0.0))
    assert _run(core, clock, 2) == []  # the load started, nothing ran (its host copy is being prepared)
    assert "a" in executor.copies and core.residency.residency("a") is Residency.PREPARING
    assert executor.copies["a"] == core.page_ids("a") and executor.copies["a"]
    executor.prepare("a")
    assert _run(core, clock, 1) == []  # copying (no CPU-assisted prefill)
    assert core.residency.residency("a") is Residency.COPYING
    executor.land("a")
    assert _run(core, clock, 1) == [("r", [7], True)]
    assert core.residency.residency("a") is Residency.DEVICE
    stats = core.stats()
    assert (stats.num_adapter_preparations, stats.adapter_prepare_seconds_total) == (1, 0.25)
    assert (stats.num_prepare_waits, stats.num_copy_waits, stats.num_adapter_hits) == (1, 1, 0)


def test_the_others_keep_stepping_while_an_adapters_host_copy_is_prepared() -> None:
    clock = ManualClock()
    core, executor = _core(clock, num_cpu_prefill_workers=1)
    core.residency.register("a", "/host/a", 4, 2000)
    core.add(make_seq("base", 4, 8, None, 0.0))
    _run(core, clock, 1)  # base's prefill
    core.add(make_seq("cold", 4, 2, "a", 1.0))
    deltas = _run(core, clock, 4)
    assert deltas == [("base", [7], False)] * 4  # a token every step; cold waits for its host copy
    assert core.residency.residency("a") is Residency.PREPARING
    executor.prepare("a")
    deltas = _run(core, clock, 1)  # cold's prefill runs on the host copy while it is copied
    assert ("cold", [7], False) in deltas and ("base", [7], False) in deltas
    assert executor.steps[-1] == [("base", 1), ("cold", 4)]
    assert core.stats().num_cpu_assisted_prefills == 1


def test_a_failed_preparation_ends_only_its_adapters_requests_and_counts_once() -> None:
    clock = ManualClock()
    core, executor = _core(clock)
    core.residency.register("a", "/host/a", 4, 2000)
    a_seq, other_a, base_seq = (
        make_seq("ra", 4, 2, "a", 0.0),
        make_seq("ra2", 4, 2, "a", 0.0),
        make_seq("rb", 4, 2, None, 0.0),
    )
    for seq in (a_seq, other_a, base_seq):
        core.add(seq)
    _run(core, clock, 1)
    executor.prepare("a", error="AdapterLoadError: adapter at /host/a is invalid: lora_B is not finite")
    deltas = _run(core, clock, 2)
    assert ("ra", [], True) in deltas and ("ra2", [], True) in deltas
    for seq in (a_seq, other_a):
        assert seq.error_code == "adapter_unavailable" and "lora_B is not finite" in (seq.error or "")
    assert base_seq.finish_reason == "length" and base_seq.error is None
    assert core.residency.residency("a") is Residency.HOST and not core.page_ids("a")
    stats = core.stats()
    assert (stats.num_adapter_load_failures, stats.num_adapter_prepare_failures) == (1, 1)
    assert (stats.num_adapter_copy_failures, stats.num_adapter_preparations) == (0, 0)


def test_a_host_tier_hit_is_not_counted_as_a_preparation() -> None:
    clock = ManualClock()
    core, executor = _core(clock)
    core.residency.register("a", "/host/a", 4, 2000)
    core.add(make_seq("r", 4, 1, "a", 0.0))
    _run(core, clock, 1)
    executor.prepare("a", is_from_host_tier=True)
    executor.land("a")
    _run(core, clock, 2)
    assert core.residency.residency("a") is Residency.DEVICE and core.stats().num_adapter_preparations == 0


def test_a_failed_copy_ends_only_its_adapters_requests() -> None:
    clock = ManualClock()
    core, executor = _core(clock)
    core.residency.register("a", "/host/a", 4, 2000)
    a_seq, base_seq = make_seq("ra", 4, 2, "a", 0.0), make_seq("rb", 4, 2, None, 0.0)
    core.add(a_seq)
    core.add(base_seq)
    _run(core, clock, 1)
    executor.prepare("a")
    executor.land("a", error="link reset")
    deltas = _run(core, clock, 2)
    assert ("ra", [], True) in deltas and a_seq.error_code == "adapter_unavailable"
    assert "link reset" in (a_seq.error or "")
    assert base_seq.finish_reason == "length" and base_seq.error is None
    assert core.stats().num_adapter_copy_failures == 1


def test_a_copy_that_cannot_start_fails_its_requests() -> None:
    clock = ManualClock()
    core, executor = _core(clock)
    executor.refused_copies.add("a")
    core.residency.register("a", "/host/a", 4, 2000)
    seq = make_seq("ra", 4, 2, "a", 0.0)
    core.add(seq)
    assert _run(core, clock, 1) == [("ra", [], True)]
    assert seq.error_code == "adapter_unavailable" and "vanished" in (seq.error or "")


def test_a_row_without_a_token_fails_alone() -> None:
    clock = ManualClock()
    core, executor = _core(clock)
    executor.failing_rows.add("bad")
    bad, good = make_seq("bad", 3, 2, None, 0.0), make_seq("good", 3, 2, None, 0.0)
    core.add(bad)
    core.add(good)
    deltas = _run(core, clock, 3)
    assert ("bad", [], True) in deltas and bad.error_code == "numeric_overflow"
    assert [d for d in deltas if d[0] == "good"] == [("good", [7], False), ("good", [7], True)]


def test_an_abort_comes_back_in_the_next_step_and_is_counted() -> None:
    clock = ManualClock()
    core, _ = _core(clock)
    seq: Sequence = make_seq("r", 3, 50, None, 0.0)
    core.add(seq)
    _run(core, clock, 1)
    clock.now = 5.0
    assert core.abort("r") and not core.abort("r")
    assert core.has_pending_deltas()
    assert _run(core, clock, 1) == [("r", [], True)]
    assert seq.finish_reason == "abort" and seq.finish_time == 5.0 and core.stats().num_aborted == 1
