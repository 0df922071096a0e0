"""`workload_from_usage`: a planner workload from recorded demand: usage rows (one per request: adapter version,
its rank and tenant, prompt and completion tokens) over a window -> per-adapter request rates and the prompt
and output length percentiles of all of them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from twin.planner.workload import AdapterLoad, LengthDistribution, Workload


@dataclass(frozen=True)
class UsageSample:
    """One recorded request."""

    adapter_key: str
    rank: int
    tenant: str | None
    prompt_tokens: int
    completion_tokens: int


def workload_from_usage(samples: Sequence[UsageSample], window_s: float) -> Workload:
    """The window's demand as a workload; ValueError when the window holds no adapter request."""
    if window_s <= 0:
        raise ValueError("the demand window must be longer than 0 s")
    used = [s for s in samples if s.rank > 0]
    if not used:
        raise ValueError(f"no adapter request was recorded in the last {window_s:g} s: nothing to plan")
    counts: dict[str, list[UsageSample]] = {}
    for s in used:
        counts.setdefault(s.adapter_key, []).append(s)
    adapters = [
        AdapterLoad(name=key, rank=rows[0].rank, rate=len(rows) / window_s, tenant=rows[0].tenant)
        for key, rows in sorted(counts.items())
    ]
    return Workload(
        prompt_tokens=_lengths([s.prompt_tokens for s in used]),
        output_tokens=_lengths([s.completion_tokens for s in used]),
        adapters=adapters,
    )


def _lengths(values: Sequence[int]) -> LengthDistribution:
    array = np.maximum(np.array(values, dtype=float), 1.0)
    p50, p90 = float(np.percentile(array, 50)), float(np.percentile(array, 90))
    return LengthDistribution(p50=p50, p90=max(p90, p50), max=max(int(array.max()), int(np.ceil(p50))))
