"""`check_candidate`: one candidate deployment re-checked in the cluster twin (twin/cluster_sim.py: the engine's
own core on every worker, production's router, placement job and policies), with the candidate's settings.

The trace is the workload's seeded Poisson arrivals (workload_trace.py) over `warmup_s` + `window_s`; the
workers are ready at time 0 and do not autoscale (the candidate's count is the plan); placement, when the
candidate has one, runs every `warmup_s` over `warmup_s` buckets, so its first table is up when the window
opens. Only requests arriving inside the check window count (the warm-up fills caches and queues); the run
goes on until they finish, so an overloaded candidate shows its queueing in the latency. A request refused at
the front door counts as missing the SLO. A window that holds no request cannot judge anything: the verdict
says so instead of passing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from settings import Settings
from twin.cluster_run import ClusterOptions
from twin.cluster_sim import simulate_cluster
from twin.planner.memory_check import adapter_device_bytes
from twin.planner.search_space import NO_PLACEMENT, Candidate
from twin.planner.slo import Slo
from twin.planner.workload import Workload
from twin.planner.workload_trace import generate_trace
from twin.profile import TwinProfile
from twin.request_record import RequestRecord
from twin.trace import AdapterSpec

MEETS = "meets SLO"
MISSES = "misses SLO"
NOT_JUDGED = "could not judge"
DEFAULT_WARMUP_S = 5.0


@dataclass(frozen=True)
class CheckOutcome:
    """What the cluster twin measured for one candidate over its check window."""

    num_requests: int
    num_refused: int
    measured_s: float  # the SLO's metric over the window's requests (inf when one was refused)
    ttft_p50_s: float
    ttft_p99_s: float
    throughput_tok_s: float
    wall_s: float
    slo: Slo

    @property
    def verdict(self) -> str:
        """MEETS, MISSES, or NOT_JUDGED when the window holds no request."""
        if self.num_requests == 0:
            return NOT_JUDGED
        return MEETS if self.num_refused == 0 and self.measured_s <= self.slo.max_s else MISSES

    @property
    def margin_pct(self) -> float | None:
        """Headroom under the SLO in percent of it (negative: over it); None when not judged."""
        if self.num_requests == 0:
            return None
        return 100.0 * (self.slo.max_s - self.measured_s) / self.slo.max_s

    def as_dict(self) -> dict[str, Any]:
        """Plain values (JSON)."""
        margin = self.margin_pct
        return {
            "verdict": self.verdict,
            "slo_metric": self.slo.metric,
            "measured_s": _rounded(self.measured_s),
            "margin_pct": None if margin is None else _rounded(margin, 1),
            "num_requests": self.num_requests,
            "num_refused": self.num_refused,
            "ttft_p50_s": _rounded(self.ttft_p50_s),
            "ttft_p99_s": _rounded(self.ttft_p99_s),
            "throughput_tok_s": _rounded(self.throughput_tok_s, 1),
            "wall_s": round(self.wall_s, 3),
        }


def candidate_settings(
    candidate: Candidate, base: Settings, profile: TwinProfile, warmup_s: float
) -> Settings:
    """`base` with the candidate's engine and cluster policies (the static share in bytes of the device)."""
    flat: dict[str, Any] = {
        "engine_max_num_seqs": candidate.max_num_seqs,
        "engine_memory_mode": candidate.memory_mode,
        "engine_batch_policy": candidate.batch_policy,
        "engine_adapter_cache_bytes": None
        if candidate.adapter_fraction is None
        else int(candidate.adapter_fraction * profile.memory.device_bytes),
        "placement_interval_s": 0.0 if candidate.placement == NO_PLACEMENT else warmup_s,
    }
    flat |= {"placement_policy": candidate.placement, "placement_bucket_s": warmup_s}
    return base.updated(**flat)


def window_requests(workload: Workload, window_s: float, warmup_s: float, seed: int) -> int:
    """Requests of the workload's seeded trace that arrive inside the check window."""
    trace = generate_trace(workload, workload.expanded(), warmup_s + window_s, seed=seed)
    return sum(1 for r in trace if r.arrival_s >= warmup_s)


def check_candidate(
    candidate: Candidate,
    workload: Workload,
    profile: TwinProfile,
    base: Settings,
    slo: Slo,
    *,
    window_s: float,
    warmup_s: float = DEFAULT_WARMUP_S,
    seed: int = 12345,
) -> CheckOutcome:
    """Run the candidate in the cluster twin and measure the window (module doc)."""
    started = time.perf_counter()
    settings = candidate_settings(candidate, base, profile, warmup_s)
    adapters = workload.expanded()
    specs = [AdapterSpec(a.adapter_id, a.rank, adapter_device_bytes(profile, a)) for a in adapters]
    trace = generate_trace(
        workload, adapters, warmup_s + window_s, seed=seed, max_model_len=settings.engine.max_model_len
    )
    options = ClusterOptions(num_initial_workers=candidate.num_workers, is_autoscaling=False)
    result = simulate_cluster(trace, specs, settings, profile, options=options)
    window = [r for r in result.records if r.arrival_s >= warmup_s]
    return _outcome(window, slo, window_s, time.perf_counter() - started)


def _outcome(records: Sequence[RequestRecord], slo: Slo, window_s: float, wall_s: float) -> CheckOutcome:
    refused = [r for r in records if not r.token_times]
    served = [r for r in records if r.token_times]
    ttft = [r.ttft_s for r in served if r.ttft_s is not None]
    metric = {
        "ttft_p50": ttft and _pct(ttft, 50),
        "ttft_p99": ttft and _pct(ttft, 99),
        "itl_p99": _pct([g for r in served for g in r.inter_token_s], 99),
        "e2e_p50": _pct([r.finish_s - r.arrival_s for r in served if r.finish_s is not None], 50),
    }[slo.metric]
    return CheckOutcome(
        num_requests=len(records),
        num_refused=len(refused),
        measured_s=float("inf") if refused else float(metric or 0.0),
        ttft_p50_s=_pct(ttft, 50),
        ttft_p99_s=_pct(ttft, 99),
        throughput_tok_s=sum(r.num_output_tokens for r in served) / window_s,
        wall_s=wall_s,
        slo=slo,
    )


def _pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def _rounded(value: float, digits: int = 4) -> float | None:
    return None if value == float("inf") else round(value, digits)
