"""`SimulatedWorker`: one worker of the digital twin, the engine's own core (scheduler/core/engine_core.py:
admission policy, page pool, adapter residency, prefix cache, batch scheduler) over a `SimulatedExecutor`,
built from the same engine settings section as the real engine (settings/engine.py) and the rank limit the
real engine gets (`max_lora_rank`: `Settings.resolved_max_lora_rank()`, resolved by the caller).

`run(trace)` replays a trace alone: requests are added when the simulated clock reaches their arrival (a
request that arrives during a step joins at the next step, as in the engine), the core steps while it has
work, and an idle worker jumps to the next arrival, host copy ready or copy landing. The cluster twin drives
many workers through `submit` / `step_until` instead. The core runs multi-step windows
(`TWIN_SCHEDULER_STEPS`, scheduler/core/multi_step.py) up to the next event, their steps priced in one executor
call: the records are those of one plan per step, only faster.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

from scheduler.core.engine_core import EngineCore
from scheduler.core.engine_request import EngineRequest, new_sequence
from scheduler.core.host_tier import HostTier
from scheduler.core.memory_geometry import MemoryGeometry
from scheduler.core.sampling import SamplingParams
from settings.engine import EngineSettings
from twin.cost_model import CostModel
from twin.request_record import RequestRecord
from twin.sim_clock import SimClock
from twin.simulated_executor import SimulatedExecutor
from twin.trace import AdapterSpec, TraceRequest

# The twin's multi-step window (scheduler/core/multi_step.py) when the engine settings say 1: a window ends
# before anything that could change its batch, and the twin steps it only up to its next event, so the
# records are those of one plan per step (tests/twin/test_worker_sim_multi_step.py); only the speed changes.
TWIN_SCHEDULER_STEPS = 256
_PROMPT_TOKEN_BASE = 1000  # synthesized prompts: distinct ids per request, far from SAMPLED_TOKEN


class SimulatedWorker:
    """One simulated worker (module doc)."""

    def __init__(
        self,
        engine: EngineSettings,
        geometry: MemoryGeometry,
        cost_model: CostModel,
        adapters: Iterable[AdapterSpec] = (),
        *,
        max_lora_rank: int,
        worker_id: str = "twin-0",
        clock: SimClock | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.clock = clock if clock is not None else SimClock()
        self.ranks: dict[str, int] = {}
        self.adapter_bytes: dict[str, int] = {}
        self.executor = SimulatedExecutor(
            geometry,
            cost_model,
            self.clock,
            self.ranks,
            self.adapter_bytes,
            HostTier(engine.host_adapter_cache_bytes),  # the engine's host tier, same budget
            max_lora_rank=max_lora_rank,
        )
        limits = engine.core_limits()
        num_steps = max(limits.num_scheduler_steps, TWIN_SCHEDULER_STEPS)
        self.core = EngineCore(
            self.executor,
            engine.admission_policy(),
            dataclasses.replace(limits, num_scheduler_steps=num_steps),
            eviction_policy=engine.eviction_policy(),
            clock=self.clock,
            step_timer=self.clock,
        )
        self.records: dict[str, RequestRecord] = {}
        self._num_requests = 0
        for adapter in adapters:
            self.register_adapter(adapter)

    # ---- adapters and requests ----------------------------------------------------------------------

    def register_adapter(self, adapter: AdapterSpec) -> None:
        """Make an adapter's host copy known (as the worker does once its files are in the local cache)."""
        self.ranks[adapter.adapter_id] = adapter.rank
        self.adapter_bytes[adapter.adapter_id] = adapter.num_bytes
        self.core.residency.register(
            adapter.adapter_id,
            f"twin://{adapter.adapter_id}",
            adapter.rank,
            adapter.num_bytes,
            adapter.num_pages,
        )

    def submit(self, request: TraceRequest) -> None:
        """Queue a request (its adapter must be registered); its arrival time is the trace's."""
        if request.adapter_id is not None and request.adapter_id not in self.ranks:
            raise ValueError(
                f"request {request.request_id!r} names unregistered adapter {request.adapter_id!r}"
            )
        max_model_len = self.core.geometry.max_model_len
        num_prompt = min(request.num_prompt_tokens, max_model_len - 1)
        first_id = _PROMPT_TOKEN_BASE + self._num_requests * 7919  # a synthesized prompt's ids
        prompt = (
            list(request.prompt_token_ids[:num_prompt])
            if request.prompt_token_ids is not None
            else range(first_id, first_id + num_prompt)
        )
        self._num_requests += 1
        max_tokens = min(request.num_output_tokens, max_model_len - num_prompt)
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        engine_request = EngineRequest(
            request.request_id,
            tuple(prompt),
            params,
            request.adapter_id,
            predicted_output_tokens=request.predicted_output_tokens,
            tenant_id=request.tenant_id,
            cache_namespace=request.tenant_id,
            arrival_time=request.arrival_s,
        )
        self.core.add(new_sequence(engine_request, max_model_len, request.arrival_s))
        self.records[request.request_id] = RequestRecord(
            request.request_id,
            request.arrival_s,
            num_prompt,
            adapter_id=request.adapter_id,
            tenant_id=request.tenant_id,
            worker_id=self.worker_id,
        )

    # ---- time -------------------------------------------------------------------------------------------

    @property
    def is_busy(self) -> bool:
        """True while a request waits or runs."""
        return self.core.has_unfinished_requests() or self.core.has_pending_deltas()

    def step(self, until: float | None = None) -> None:
        """One engine-core step at the clock's time (the steps of a multi-step window up to `until`); when it
        ran nothing and heard of no adapter load (every
        request waits for one), the clock moves to the next host copy ready or copy landing, or to `until`
        (the next arrival) when that comes first."""
        steps_before, results_before = self.executor.num_steps, self.executor.num_results_taken
        started = self.clock()
        records = self.records
        for delta in self.core.step(horizon=math.inf if until is None else until):
            seq = delta.seq
            record = records[seq.request_id]
            record.token_times.extend(delta.token_times)
            record.first_scheduled_s = seq.first_scheduled_time
            if seq.is_finished:
                record.finish_s, record.finish_reason, record.error_code = (
                    seq.finish_time,
                    seq.finish_reason,
                    seq.error_code,
                )
        is_idle = self.executor.num_steps == steps_before and self.clock() == started
        if is_idle and self.executor.num_results_taken == results_before:
            if not self.core.has_unfinished_requests():
                return
            moment = self.executor.next_transfer_at()
            if moment is None:
                raise RuntimeError(
                    f"{self.worker_id}: requests wait but nothing can run and no adapter load is in flight "
                    "(an adapter that can never fit?)"
                )
            self.clock.advance_to(moment if until is None else min(moment, until))

    def step_until(self, moment: float) -> None:
        """Step while busy and the clock is before `moment`; an idle worker's clock moves to `moment`."""
        while self.clock() < moment and self.is_busy:
            self.step(until=moment)
        if not self.is_busy:
            self.clock.advance_to(moment)

    def run(self, trace: Sequence[TraceRequest]) -> list[RequestRecord]:
        """Replay `trace` (sorted by arrival) alone and return a record per request, in trace order."""
        ordered = sorted(trace, key=lambda r: r.arrival_s)
        for request in ordered:
            self.step_until(request.arrival_s)
            self.submit(request)
        while self.is_busy:
            self.step()
        return [self.records[r.request_id] for r in trace]
