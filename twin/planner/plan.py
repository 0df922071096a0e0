"""`make_plan`: the fewest GPUs, their adapters and adapter caches for a workload, predicted by the surrogate
and checked in the twin.

1. Placement (placement.py) with a judge that, for a GPU's adapters, tries adapter caches of every testing-point
   slot count up to all of them, drops those failing the analytic memory check, predicts each with the
   surrogate and keeps the most slots within 2% of the highest predicted throughput among those predicted neither starved (nor serving
   below `STARVED_FRACTION`) nor over the SLO. Where the surrogate refuses one adapter alone, a twin run decides.
2. The twin check: every planned GPU runs in the twin (`run_gpu`, a seed the surrogate never saw). A GPU that
   starves, overflows or misses the SLO there is split onto two GPUs (adapters zig-zag by rate; a lone
   adapter's rate in two shares) and the new GPUs are checked, until every GPU passes (or `max_rounds`).
   A plan whose twin check still fails says so (`is_twin_ok` False); callers refuse it.
3. Consolidation: while the two least loaded GPUs, merged, fit the memory and pass the twin, they are merged
   (fewer GPUs where the surrogate was too careful; every merge is checked, so the plan stays valid).
The surrogate predicts TTFT p99 only: an SLO on another metric (ttft_p50, itl_p99, e2e_p50) is held by the twin
check alone. `compare_baselines`: MaxBase and Random, checked in the same twin.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from settings.api import DEFAULT_MAX_LORA_RANK
from settings.engine import EngineSettings
from twin.planner.gpu_features import gpu_features
from twin.planner.gpu_run import STARVED_FRACTION, GpuOutcome, GpuSetup, run_gpu
from twin.planner.memory_check import (
    DEFAULT_MIN_KV_SEQUENCES,
    adapter_cache_bytes,
    cache_bytes_for_slots,
    check_memory,
)
from twin.planner.placement import (
    TEST_POINTS,
    Placed,
    ffd_order,
    place_ffd,
    place_max_base,
    place_random,
    spread_latency,
)
from twin.planner.slo import Slo
from twin.planner.surrogate import Prediction, Surrogate, SurrogateForm
from twin.planner.workload import PlannedAdapter, Workload
from twin.profile import TwinProfile


@dataclass(frozen=True)
class PlanOptions:
    """How to plan and check: objective "throughput" (fewest GPUs) or "latency" (same GPUs, load spread)."""

    slo: Slo | None = None
    objective: str = "throughput"
    form: SurrogateForm = "forest"
    check_duration_s: float = 30.0
    check_seed: int = 12345
    max_rounds: int = 8
    min_kv_sequences: int = DEFAULT_MIN_KV_SEQUENCES
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK


@dataclass(frozen=True)
class GpuChoice:
    """The judge's answer for one GPU: its adapter cache and the surrogate's prediction."""

    cache_bytes: int
    num_cache_slots: int
    prediction: Prediction


@dataclass
class PlannedGpu:
    """One GPU of a plan; `twin` is its check."""

    adapters: tuple[PlannedAdapter, ...]
    cache_bytes: int
    num_cache_slots: int
    prediction: Prediction | None
    twin: GpuOutcome | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain values (JSON)."""
        return {
            "adapters": [
                {"adapter_id": a.adapter_id, "rank": a.rank, "rate": round(a.rate, 6)} for a in self.adapters
            ],
            "cache_bytes": self.cache_bytes,
            "num_cache_slots": self.num_cache_slots,
            "total_rate": round(sum(a.rate for a in self.adapters), 6),
            "predicted": None
            if self.prediction is None
            else {
                "throughput_tok_s": round(self.prediction.throughput_tok_s, 1),
                "served_fraction": round(self.prediction.served_fraction, 3),
                "starvation_probability": round(self.prediction.starvation_probability, 3),
                "ttft_p99_s": round(self.prediction.ttft_p99_s, 4),
            },
            "twin": None if self.twin is None else self.twin.as_dict(),
        }


@dataclass
class Plan:
    """A plan and its twin check."""

    gpus: list[PlannedGpu]
    slo: Slo | None
    objective: str
    num_rounds: int
    plan_s: float
    check_s: float
    num_training_samples: int
    notes: list[str] = field(default_factory=list)

    @property
    def num_gpus(self) -> int:
        """GPUs needed."""
        return len(self.gpus)

    @property
    def verdict(self) -> str:
        """ "could not judge" when no GPU's check window held a request, else "meets SLO" / "misses SLO"."""
        if all(g.twin is None or g.twin.num_requests == 0 for g in self.gpus):
            return "could not judge"
        return "meets SLO" if self.is_twin_ok else "misses SLO"

    @property
    def is_twin_ok(self) -> bool:
        """Every GPU passed the twin check (no starvation, no overflow, the SLO met)."""
        return all(g.twin is not None and g.twin.meets(self.slo) for g in self.gpus)

    def as_dict(self) -> dict[str, Any]:
        """Plain values (JSON)."""
        predicted = [g.prediction for g in self.gpus if g.prediction is not None]
        twins = [g.twin for g in self.gpus if g.twin is not None]
        return {
            "num_gpus": self.num_gpus,
            "objective": self.objective,
            "slo": None if self.slo is None else str(self.slo),
            "predicted_throughput_tok_s": round(sum(p.throughput_tok_s for p in predicted), 1),
            "predicted_ttft_p99_s": round(max((p.ttft_p99_s for p in predicted), default=0.0), 4),
            "twin_throughput_tok_s": round(sum(t.throughput_tok_s for t in twins), 1),
            "twin_offered_tok_s": round(sum(t.offered_tok_s for t in twins), 1),
            "twin_ttft_p99_s": round(max((t.ttft_p99_s for t in twins), default=0.0), 4),
            "twin_ok": self.is_twin_ok,
            "verdict": self.verdict,
            "num_unjudged_gpus": sum(1 for t in twins if t.num_requests == 0),
            "num_rounds": self.num_rounds,
            "plan_s": round(self.plan_s, 3),
            "check_s": round(self.check_s, 3),
            "num_training_samples": self.num_training_samples,
            "gpus": [g.as_dict() for g in self.gpus],
            "notes": self.notes,
        }


class Planner:
    """Plans one workload on one profile (module doc)."""

    def __init__(
        self,
        profile: TwinProfile,
        engine: EngineSettings,
        workload: Workload,
        surrogate: Surrogate,
        options: PlanOptions = PlanOptions(),
    ) -> None:
        self.profile, self.engine, self.workload = profile, engine, workload
        self.surrogate, self.options = surrogate, options
        self._alone: dict[tuple[str, float, int], GpuOutcome | None] = {}

    def size_of(self, adapter: PlannedAdapter) -> int:
        """Pool bytes of the adapter."""
        return adapter_cache_bytes(self.profile, adapter)

    def judge(self, adapters: Sequence[PlannedAdapter]) -> GpuChoice | None:
        """The best acceptable adapter cache for these adapters on one GPU, or None (module doc)."""
        slots = sorted({p for p in TEST_POINTS if p < len(adapters)} | {len(adapters)})
        candidates = []
        for num_slots in slots:
            cache = cache_bytes_for_slots(self.profile, adapters, num_slots)
            memory = check_memory(
                self.profile, self.workload, adapters, cache, min_kv_sequences=self.options.min_kv_sequences
            )
            if memory.is_fitting:
                candidates.append((num_slots, cache))
        if not candidates:
            return None
        rows = [
            gpu_features(self.profile, self.engine, self.workload, adapters, cache) for _, cache in candidates
        ]
        predictions = self.surrogate.predict(rows, self.options.form)
        acceptable = [
            GpuChoice(cache, num_slots, prediction)
            for (num_slots, cache), prediction in zip(candidates, predictions, strict=True)
            if self._is_acceptable(prediction)
        ]
        best: GpuChoice | None = None
        if acceptable:  # the most slots (fewest cold starts) within 2% of the best predicted throughput
            top = max(c.prediction.throughput_tok_s for c in acceptable)
            best = max(
                (c for c in acceptable if c.prediction.throughput_tok_s >= 0.98 * top),
                key=lambda c: c.num_cache_slots,
            )
        if best is None and len(adapters) == 1:
            return self._judge_alone_in_twin(adapters[0], candidates[-1][1])
        return best

    def _judge_alone_in_twin(self, adapter: PlannedAdapter, cache_bytes: int) -> GpuChoice | None:
        """The twin decides where the surrogate refuses one adapter alone (it must not make an adapter
        unplaceable, or split it needlessly, by erring at the edge of its training data)."""
        key = (adapter.adapter_id, adapter.rate, cache_bytes)
        if key not in self._alone:
            run = self.check(PlannedGpu((adapter,), cache_bytes, 1, None))
            self._alone[key] = run if run.meets(self.options.slo) else None
        outcome = self._alone[key]
        if outcome is None:
            return None
        measured = Prediction(
            outcome.throughput_tok_s, outcome.served_fraction, float(outcome.is_starved), outcome.ttft_p99_s
        )
        return GpuChoice(cache_bytes, 1, measured)

    def place(self) -> list[PlannedGpu]:
        """The surrogate's placement (objective-dependent)."""
        adapters = [a for a in self.workload.expanded() if a.rate > 0]
        placed = place_ffd(adapters, self.judge, self.size_of)
        if self.options.objective == "latency":
            spread = spread_latency([a for p in placed for a in p.adapters], len(placed), self.judge)
            placed = spread if spread is not None else placed
        return [self._planned(p) for p in placed]

    def check(self, gpu: PlannedGpu) -> GpuOutcome:
        """Run one planned GPU in the twin."""
        return run_gpu(
            self.profile, self.engine, self.workload, GpuSetup(gpu.adapters, gpu.cache_bytes),
            duration_s=self.options.check_duration_s, seed=self.options.check_seed,
            max_lora_rank=self.options.max_lora_rank,
        )  # fmt: skip

    def plan(self) -> Plan:
        """Place, then check in the twin and fix until it agrees (module doc)."""
        started = time.perf_counter()
        gpus = self.place()
        plan_s = time.perf_counter() - started
        notes: list[str] = []
        rounds = 0
        pending = list(gpus)
        while pending and rounds < self.options.max_rounds:
            rounds += 1
            failed = []
            for gpu in pending:
                gpu.twin = self.check(gpu)
                if not gpu.twin.meets(self.options.slo):
                    failed.append(gpu)
            pending = []
            for gpu in failed:
                notes.append(
                    f"round {rounds}: a GPU of {len(gpu.adapters)} adapters failed the twin check; split in two"
                )
                index = gpus.index(gpu)
                halves = [self._fallback(h) for h in self._halves(gpu.adapters)]
                gpus[index : index + 1] = halves
                pending += halves
        if not pending:
            rounds += self._consolidate(gpus, notes)
        check_s = time.perf_counter() - started - plan_s
        return Plan(
            gpus,
            self.options.slo,
            self.options.objective,
            rounds,
            plan_s,
            check_s,
            self.surrogate.num_samples,
            notes,
        )

    def _consolidate(self, gpus: list[PlannedGpu], notes: list[str]) -> int:
        """The twin tightens a passing plan: merge the two least loaded GPUs while the merged GPU fits the
        memory and passes the twin check (the surrogate errs on the safe side near its boundary). Returns the
        twin runs it made."""
        num_runs = 0
        while len(gpus) > 1 and num_runs < self.options.max_rounds:
            first, second = sorted(gpus, key=lambda g: sum(a.rate for a in g.adapters))[:2]
            ids = {a.adapter_id for a in first.adapters}
            if any(a.adapter_id in ids for a in second.adapters):
                return num_runs  # shares of one adapter stay on different GPUs
            merged = self._fallback((*first.adapters, *second.adapters))
            if not check_memory(self.profile, self.workload, merged.adapters, merged.cache_bytes).is_fitting:
                return num_runs
            merged.twin = self.check(merged)
            num_runs += 1
            if not merged.twin.meets(self.options.slo):
                return num_runs
            notes.append(
                f"twin consolidation: two GPUs of {len(first.adapters)} and {len(second.adapters)} adapters merged"
            )
            gpus.remove(second)
            gpus[gpus.index(first)] = merged
        return num_runs

    def _is_acceptable(self, prediction: Prediction) -> bool:
        if prediction.is_starved or prediction.served_fraction < STARVED_FRACTION:
            return False
        slo = self.options.slo
        return slo is None or slo.metric != "ttft_p99" or prediction.ttft_p99_s <= slo.max_s

    def _planned(self, placed: Placed[GpuChoice]) -> PlannedGpu:
        c = placed.choice
        return PlannedGpu(placed.adapters, c.cache_bytes, c.num_cache_slots, c.prediction)

    def _halves(self, adapters: Sequence[PlannedAdapter]) -> list[tuple[PlannedAdapter, ...]]:
        if len(adapters) == 1:
            return [(adapters[0].share(2),), (adapters[0].share(2),)]
        ordered = sorted(adapters, key=lambda a: -a.rate)
        return [tuple(ordered[0::2]), tuple(ordered[1::2])]

    def _fallback(self, adapters: tuple[PlannedAdapter, ...]) -> PlannedGpu:
        """A GPU for a split: the judge's cache, else the largest cache the memory check allows."""
        choice = self.judge(adapters)
        if choice is not None:
            return PlannedGpu(adapters, choice.cache_bytes, choice.num_cache_slots, choice.prediction)
        for num_slots in range(len(adapters), 0, -1):
            cache = cache_bytes_for_slots(self.profile, adapters, num_slots)
            if check_memory(self.profile, self.workload, adapters, cache).is_fitting:
                [prediction] = self.surrogate.predict(
                    [gpu_features(self.profile, self.engine, self.workload, adapters, cache)],
                    self.options.form,
                )
                return PlannedGpu(adapters, cache, num_slots, prediction)
        return PlannedGpu(adapters, cache_bytes_for_slots(self.profile, adapters, 1), 1, None)


@dataclass(frozen=True)
class BaselineResult:
    """A baseline placement and what the twin says of it."""

    name: str
    num_gpus: int
    num_starved: int
    num_overflow: int
    num_slo_missed: int
    outcomes: list[GpuOutcome]

    def as_dict(self) -> dict[str, Any]:
        """Plain values (JSON)."""
        return {
            "name": self.name,
            "num_gpus": self.num_gpus,
            "num_starved_gpus": self.num_starved,
            "num_overflow_gpus": self.num_overflow,
            "num_slo_missed_gpus": self.num_slo_missed,
            "twin_ok": self.num_starved == 0 and self.num_overflow == 0 and self.num_slo_missed == 0,
        }


def compare_baselines(planner: Planner, num_gpus: int, *, seed: int = 0) -> list[BaselineResult]:
    """MaxBase (memory-full GPUs, every adapter resident) and Random (over `num_gpus`, the plan's count), each
    checked in the twin as the plan is."""
    adapters = [a for a in planner.workload.expanded() if a.rate > 0]

    def full_cache(members: Sequence[PlannedAdapter]) -> int:
        return cache_bytes_for_slots(planner.profile, members, len(members))

    def fits(members: Sequence[PlannedAdapter]) -> bool:
        return check_memory(planner.profile, planner.workload, members, full_cache(members)).is_fitting

    placements = {
        "MaxBase": place_max_base(adapters, fits, planner.size_of),
        "Random": place_random(ffd_order(adapters, planner.size_of), num_gpus, seed=seed),
    }
    results = []
    for name, gpus in placements.items():
        outcomes = []
        for members in gpus:
            cache = full_cache(members)
            for n in range(len(members), 0, -1):  # Random may overfill: the largest cache memory allows
                cache = cache_bytes_for_slots(planner.profile, members, n)
                if check_memory(planner.profile, planner.workload, members, cache).is_fitting:
                    break
            outcomes.append(planner.check(PlannedGpu(members, cache, len(members), None)))
        results.append(
            BaselineResult(
                name,
                len(gpus),
                sum(o.is_starved and not o.is_memory_overflow for o in outcomes),
                sum(o.is_memory_overflow for o in outcomes),
                sum(not o.meets(planner.options.slo) and not o.is_starved for o in outcomes),
                outcomes,
            )
        )
    return results
