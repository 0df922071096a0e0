"""`generate_trace`: a seeded synthetic trace of a workload's adapters: independent Poisson arrivals per adapter
at its rate over `duration_s`, prompt and output lengths drawn from the workload's distributions."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from twin.planner.workload import LengthDistribution, PlannedAdapter, Workload
from twin.trace import TraceRequest


def generate_trace(
    workload: Workload,
    adapters: Sequence[PlannedAdapter],
    duration_s: float,
    *,
    seed: int = 0,
    max_model_len: int | None = None,
) -> list[TraceRequest]:
    """Requests of `adapters` arriving over [0, duration_s), sorted by arrival; prompt + output is kept within
    `max_model_len` when given."""
    rng = random.Random(seed)
    requests: list[TraceRequest] = []
    for adapter in adapters:
        if adapter.rate <= 0:
            continue
        t = rng.expovariate(adapter.rate)
        while t < duration_s:
            num_prompt = _draw(workload.prompt_tokens, rng)
            num_output = _draw(workload.output_tokens, rng)
            if max_model_len is not None:
                num_prompt = min(num_prompt, max_model_len - 1)
                num_output = max(1, min(num_output, max_model_len - num_prompt))
            requests.append(
                TraceRequest(
                    f"{adapter.adapter_id}#{len(requests)}",
                    t,
                    num_prompt,
                    num_output,
                    adapter_id=adapter.adapter_id,
                    tenant_id=adapter.tenant,
                )
            )
            t += rng.expovariate(adapter.rate)
    requests.sort(key=lambda r: r.arrival_s)
    return requests


def _draw(lengths: LengthDistribution, rng: random.Random) -> int:
    value = lengths.p50 * math.exp(lengths.sigma * rng.gauss(0.0, 1.0))
    return max(1, min(lengths.upper, round(value)))
