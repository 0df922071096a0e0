"""The planner's search space and its fast estimate.

A `Candidate` is one deployment: the number of workers (its cost: workers x the GPU's price per hour) and the
engine and cluster policies every worker runs: `max_num_seqs`, the memory mode (unified, or static with a
fraction of the device for adapters: the pool split), the batch policy (scheduler/admission/batch_policy.py
BATCH_POLICIES) and the placement (one of scheduler/placement/placement_baselines.py PLACEMENT_POLICIES, behind
the configured router; `demand_only`, which publishes no routing rows, is checked without a placement job: the
router alone, placement-free).

`estimate` is the fast estimate that prunes a candidate before any twin run: the analytic memory check
(memory_check.py: the adapter share must hold the largest adapter and leave the minimum KV pool; a unified pool
must hold both) and the analytic load (`capacity_req_s`, the surrogate's own capacity feature, at the batch the
KV pool can hold): offered requests over the workers' capacity above `MAX_ESTIMATED_LOAD` cannot meet any SLO.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.admission.batch_policy import BATCH_POLICIES
from scheduler.placement.placement_baselines import PLACEMENT_POLICIES
from settings.engine import EngineSettings
from twin.planner.gpu_features import capacity_req_s
from twin.planner.memory_check import adapter_cache_bytes, check_memory, min_kv_bytes
from twin.planner.workload import Workload
from twin.profile import TwinProfile

NO_PLACEMENT = "demand_only"  # no routing rows: checked without a placement job
MAX_NUM_SEQS_CHOICES = (32, 64, 128, 256)
STATIC_FRACTIONS = (0.05, 0.1, 0.2)  # of the device's bytes for the static adapter share
MAX_ESTIMATED_LOAD = 1.5  # the analytic capacity is rough: prune only what is clearly past it


@dataclass(frozen=True, order=True)
class Candidate:
    """One deployment the search may choose (module doc); `adapter_fraction` is None in a unified pool."""

    num_workers: int
    max_num_seqs: int
    memory_mode: str
    adapter_fraction: float | None
    batch_policy: str
    placement: str

    @property
    def setup(self) -> tuple[int, str, float | None, str, str]:
        """Everything but the worker count."""
        return (self.max_num_seqs, self.memory_mode, self.adapter_fraction, self.batch_policy, self.placement)

    def memory_label(self) -> str:
        """ "unified" or "static 10%" (the adapter share of the device)."""
        if self.adapter_fraction is None:
            return self.memory_mode
        return f"{self.memory_mode} {self.adapter_fraction * 100:g}%"

    def label(self) -> str:
        """One line: workers, max_num_seqs, memory, batch policy, placement."""
        return (
            f"{self.num_workers} workers, max_num_seqs {self.max_num_seqs}, {self.memory_label()}, "
            f"{self.batch_policy}, placement {self.placement}"
        )

    def as_dict(self) -> dict[str, Any]:
        """Plain values (JSON)."""
        return {
            "num_workers": self.num_workers,
            "max_num_seqs": self.max_num_seqs,
            "memory_mode": self.memory_mode,
            "adapter_fraction": self.adapter_fraction,
            "batch_policy": self.batch_policy,
            "placement": self.placement,
        }


@dataclass(frozen=True)
class Estimate:
    """The fast estimate of one candidate: `pruned` names why it cannot meet the SLO ("" when it may)."""

    load: float
    num_batch_seqs: int
    pruned: str = ""
    reason: str = ""


def setups(engine: EngineSettings, placement_policy: str) -> list[tuple[int, str, float | None, str, str]]:
    """Every setup (a candidate without its worker count); the deployment's own first (its reference)."""
    reference = reference_setup(engine, placement_policy)
    seqs = sorted({*MAX_NUM_SEQS_CHOICES, engine.max_num_seqs})
    memories: list[tuple[str, float | None]] = [("unified", None)]
    memories += [("static", f) for f in STATIC_FRACTIONS]
    placements = [NO_PLACEMENT, *sorted(set(PLACEMENT_POLICIES) - {NO_PLACEMENT})]
    out = [reference]
    for s in seqs:
        for mode, fraction in memories:
            for batch in sorted(BATCH_POLICIES):
                out += [
                    (s, mode, fraction, batch, p)
                    for p in placements
                    if (s, mode, fraction, batch, p) != reference
                ]
    return out


def reference_setup(engine: EngineSettings, placement_policy: str) -> tuple[int, str, float | None, str, str]:
    """The configured deployment as a setup (static: its adapter share rounded to the nearest fraction)."""
    fraction = None if engine.memory_mode == "unified" else STATIC_FRACTIONS[1]
    return (engine.max_num_seqs, engine.memory_mode, fraction, engine.batch_policy, placement_policy)


def estimate(
    candidate: Candidate, profile: TwinProfile, engine: EngineSettings, workload: Workload
) -> Estimate:
    """The fast estimate (module doc)."""
    adapters = workload.expanded()
    device = profile.memory.device_bytes
    largest = max(adapter_cache_bytes(profile, a) for a in adapters)
    if candidate.adapter_fraction is not None:
        share = int(candidate.adapter_fraction * device)
        memory = check_memory(profile, workload, adapters, share)
        if not memory.is_fitting:
            return Estimate(0.0, 0, "memory", memory.reason)
        kv_bytes = device - share
    else:
        need = min_kv_bytes(profile, workload, 8) + largest
        if need > device:
            return Estimate(
                0.0,
                0,
                "memory",
                f"the device ({device} B) holds neither the largest adapter and the minimum KV ({need} B)",
            )
        kv_bytes = device - largest
    tokens_per_seq = workload.prompt_tokens.mean + workload.output_tokens.mean
    num_batch = min(candidate.max_num_seqs, int(kv_bytes / profile.kv_bytes_per_token / tokens_per_seq))
    if num_batch < 1:
        return Estimate(float("inf"), 0, "memory", "the KV pool holds no request of mean length")
    sized = engine.model_copy(update={"max_num_seqs": num_batch})
    capacity = capacity_req_s(profile, sized, workload.prompt_tokens.mean, workload.output_tokens.mean)
    load = sum(a.rate for a in adapters) / (candidate.num_workers * capacity)
    if load > MAX_ESTIMATED_LOAD:
        return Estimate(load, num_batch, "load", f"estimated load {load:.2f} of the workers' capacity")
    return Estimate(load, num_batch)


def min_workers(
    profile: TwinProfile,
    engine: EngineSettings,
    workload: Workload,
    setups_: Sequence[tuple[int, str, float | None, str, str]],
) -> int:
    """The fewest workers any setup may serve the workload with on the estimate (at least 1)."""
    best = float("inf")
    for setup in setups_:
        probe = estimate(Candidate(1, *setup), profile, engine, workload)
        if probe.pruned != "memory":
            best = min(best, probe.load)
    if best == float("inf"):
        return 1
    return max(1, int(-(-best // MAX_ESTIMATED_LOAD)))
