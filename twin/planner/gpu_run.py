"""`run_gpu`: one planned GPU in the twin. A `SimulatedWorker` (the engine's own core, static memory: the
planned adapter cache beside the KV pool) replays a seeded trace of the GPU's adapters over `duration_s` and
stops there (no drain, so an overloaded GPU costs no more than a loaded one).

Steady state, not a cold boot: each adapter first serves a one-token request at time 0 (its copy lands, as in
a worker that has served it before; with fewer cache slots than adapters they are evicted again as in
production), and the trace starts `WARMUP_S` later; warm-up requests count nowhere.
Starvation (the paper's): output tokens emitted by the end below `STARVED_FRACTION` of the output tokens asked
by the arrivals up to `GRACE_S` before the end: requests then wait without bound. Latencies count a request still waiting at
the end as waiting until the end (censored, so a starving GPU's TTFT is not flattered). A memory overflow
(an adapter or a request that can never fit) is reported, not raised.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np

from settings.api import DEFAULT_MAX_LORA_RANK
from settings.engine import EngineSettings
from twin.cost_model import CostModel
from twin.planner.memory_check import adapter_device_bytes
from twin.planner.slo import Slo
from twin.planner.workload import PlannedAdapter, Workload
from twin.planner.workload_trace import generate_trace
from twin.profile import TwinProfile
from twin.request_record import RequestRecord
from twin.trace import AdapterSpec, TraceRequest
from twin.worker_sim import SimulatedWorker

STARVED_FRACTION = 0.9
WARMUP_S = 1.0
GRACE_S = 2.0


@dataclass(frozen=True)
class GpuSetup:
    """One planned GPU: its adapters (shares of hot adapters carry part of the rate) and adapter cache."""

    adapters: tuple[PlannedAdapter, ...]
    cache_bytes: int

    @property
    def total_rate(self) -> float:
        """Requests per second routed here."""
        return sum(a.rate for a in self.adapters)


@dataclass(frozen=True)
class GpuOutcome:
    """What the twin measured on one GPU (seconds; tokens per second of output)."""

    throughput_tok_s: float
    offered_tok_s: float
    served_fraction: float  # tokens emitted by the end / tokens asked by arrivals up to GRACE_S before it
    is_starved: bool
    is_memory_overflow: bool
    num_requests: int
    ttft_p50_s: float
    ttft_p99_s: float
    itl_p99_s: float
    e2e_p50_s: float
    wall_s: float
    error: str = ""

    def meets(self, slo: Slo | None) -> bool:
        """Neither starved nor overflowing, and within `slo` when one is given."""
        if self.is_starved or self.is_memory_overflow:
            return False
        return slo is None or float(getattr(self, slo.summary_field)) <= slo.max_s

    def as_dict(self) -> dict[str, float | bool | int | str]:
        """Plain values (JSON)."""
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def run_gpu(
    profile: TwinProfile,
    engine: EngineSettings,
    workload: Workload,
    setup: GpuSetup,
    *,
    duration_s: float,
    seed: int = 0,
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK,
) -> GpuOutcome:
    """Replay `setup`'s share of `workload` on one simulated worker (module doc)."""
    started = time.perf_counter()
    settings = engine.model_copy(update={"memory_mode": "static", "adapter_cache_bytes": setup.cache_bytes})
    try:
        geometry = profile.geometry(
            "static", adapter_cache_bytes=setup.cache_bytes, max_lora_rank=max_lora_rank,
            max_model_len=engine.max_model_len,
        )  # fmt: skip
    except ValueError as exc:
        return _overflow(str(exc), started)
    specs = [AdapterSpec(a.adapter_id, a.rank, adapter_device_bytes(profile, a)) for a in setup.adapters]
    worker = SimulatedWorker(settings, geometry, CostModel(profile), specs, max_lora_rank=max_lora_rank)
    measured = generate_trace(
        workload, setup.adapters, duration_s, seed=seed, max_model_len=geometry.max_model_len
    )
    trace = [replace(r, arrival_s=r.arrival_s + WARMUP_S) for r in measured]
    warmups = [
        TraceRequest(f"warm#{a.adapter_id}", 0.0, 1, 1, adapter_id=a.adapter_id) for a in setup.adapters
    ]
    end = WARMUP_S + duration_s
    try:
        for request in [*warmups, *trace]:
            worker.step_until(request.arrival_s)
            worker.submit(request)
        worker.step_until(end)
    except RuntimeError as exc:  # an adapter or request that can never fit
        return _overflow(str(exc), started)
    records = [worker.records[r.request_id] for r in trace]
    asked = sum(r.num_output_tokens for r in trace if r.arrival_s <= end - GRACE_S)
    return _outcome(records, asked, sum(r.num_output_tokens for r in trace), duration_s, end, started)


def _outcome(
    records: Sequence[RequestRecord],
    num_due: int,
    num_asked: int,
    duration_s: float,
    end: float,
    started: float,
) -> GpuOutcome:
    emitted = sum(sum(1 for t in r.token_times if t <= end) for r in records)
    ttft = [(r.token_times[0] if r.token_times else end) - r.arrival_s for r in records]
    e2e = [(r.finish_s if r.finish_s is not None else end) - r.arrival_s for r in records]
    gaps = [g for r in records for g in r.inter_token_s]
    return GpuOutcome(
        throughput_tok_s=emitted / duration_s,
        offered_tok_s=num_asked / duration_s,
        served_fraction=emitted / max(num_due, 1),
        is_starved=emitted < STARVED_FRACTION * num_due,
        is_memory_overflow=False,
        num_requests=len(records),
        ttft_p50_s=_pct(ttft, 50),
        ttft_p99_s=_pct(ttft, 99),
        itl_p99_s=_pct(gaps, 99),
        e2e_p50_s=_pct(e2e, 50),
        wall_s=time.perf_counter() - started,
    )


def _overflow(reason: str, started: float) -> GpuOutcome:
    inf = float("inf")
    return GpuOutcome(0.0, 0.0, 0.0, True, True, 0, inf, inf, inf, inf, time.perf_counter() - started, reason)


def _pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0
