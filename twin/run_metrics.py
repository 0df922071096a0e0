"""`RunSummary`: throughput and latency percentiles of one run's `RequestRecord`s (real engine or twin), and
SMAPE between two summaries (the twin's fidelity metric, ../shared/papers/digital_twin.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from twin.request_record import RequestRecord


@dataclass(frozen=True)
class RunSummary:
    """Seconds unless named otherwise; percentiles over the finished requests (ITL over all token gaps)."""

    num_requests: int
    num_finished: int
    duration_s: float  # first arrival to last finish
    throughput_tok_s: float  # output tokens per second over duration_s
    ttft_p50_s: float
    ttft_p99_s: float
    itl_p50_s: float
    itl_p99_s: float
    queueing_p50_s: float
    queueing_p99_s: float
    e2e_p50_s: float

    def as_dict(self) -> dict[str, float]:
        """Plain values (for JSON and tables)."""
        return {k: float(v) for k, v in asdict(self).items()}


COMPARED = ("throughput_tok_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "queueing_p50_s")


def summarize(records: Sequence[RequestRecord]) -> RunSummary:
    """Summarize a run; ValueError when nothing finished."""
    done = [r for r in records if r.finish_s is not None and r.token_times]
    if not done:
        raise ValueError("no request finished with a token: nothing to summarize")
    start = min(r.arrival_s for r in records)
    end = max(r.finish_s for r in done if r.finish_s is not None)
    duration = max(end - start, 1e-9)
    ttft = [r.ttft_s for r in done if r.ttft_s is not None]
    queueing = [r.queueing_s for r in done if r.queueing_s is not None]
    gaps = [g for r in done for g in r.inter_token_s]
    e2e = [r.finish_s - r.arrival_s for r in done if r.finish_s is not None]
    return RunSummary(
        num_requests=len(records),
        num_finished=len(done),
        duration_s=duration,
        throughput_tok_s=sum(r.num_output_tokens for r in done) / duration,
        ttft_p50_s=_pct(ttft, 50),
        ttft_p99_s=_pct(ttft, 99),
        itl_p50_s=_pct(gaps, 50),
        itl_p99_s=_pct(gaps, 99),
        queueing_p50_s=_pct(queueing, 50),
        queueing_p99_s=_pct(queueing, 99),
        e2e_p50_s=_pct(e2e, 50),
    )


def smape(real: float, twin: float) -> float:
    """Symmetric absolute percentage error, in percent (0 when both are 0)."""
    denominator = abs(real) + abs(twin)
    return 0.0 if denominator == 0 else 200.0 * abs(twin - real) / denominator


def median_summary(runs: Sequence[RunSummary]) -> RunSummary:
    """Each field's median over repeated runs of one trace (the real engine is not deterministic; the twin
    is): ValueError when there is no run."""
    if not runs:
        raise ValueError("no run to take the median of")
    medians = {k: float(np.median([getattr(run, k) for run in runs])) for k in asdict(runs[0])}
    counts = {k: round(medians[k]) for k in ("num_requests", "num_finished")}
    return RunSummary(**{**medians, **counts})  # type: ignore[arg-type]


def spread_pct(runs: Sequence[RunSummary], metrics: Sequence[str] = COMPARED) -> dict[str, float]:
    """Per metric, (max - min) / median of repeated runs, in percent (0 where the median is 0)."""
    spread = {}
    for m in metrics:
        values = [getattr(run, m) for run in runs]
        median = float(np.median(values))
        spread[m] = 100.0 * (max(values) - min(values)) / median if median else 0.0
    return spread


def compare(real: RunSummary, twin: RunSummary, metrics: Sequence[str] = COMPARED) -> dict[str, float]:
    """SMAPE per metric (percent)."""
    return {m: smape(getattr(real, m), getattr(twin, m)) for m in metrics}


def _pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0
