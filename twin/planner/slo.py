"""`Slo`: a latency objective a plan must meet, parsed from "ttft_p99=2s" (metrics: ttft_p50, ttft_p99,
itl_p99, e2e_p50; units s or ms, bare numbers are seconds)."""

from __future__ import annotations

import re
from dataclasses import dataclass

SLO_METRICS = ("ttft_p50", "ttft_p99", "itl_p99", "e2e_p50")
_PATTERN = re.compile(r"^\s*([a-z0-9_]+)\s*(?:=|<=)\s*([0-9]*\.?[0-9]+)\s*(ms|s)?\s*$")


@dataclass(frozen=True)
class Slo:
    """`metric` (a RunSummary field without `_s`) must be at most `max_s` seconds."""

    metric: str
    max_s: float

    @property
    def summary_field(self) -> str:
        """The RunSummary attribute it reads."""
        return f"{self.metric}_s"

    def __str__(self) -> str:
        return f"{self.metric}<={self.max_s:g}s"


def parse_slo(text: str) -> Slo:
    """Parse "metric=value[s|ms]"; ValueError saying the accepted form."""
    match = _PATTERN.match(text.lower())
    if match is None or match.group(1) not in SLO_METRICS:
        raise ValueError(
            f"bad SLO {text!r}: write METRIC=VALUE[s|ms] with METRIC one of {', '.join(SLO_METRICS)}, "
            "e.g. ttft_p99=2s"
        )
    value = float(match.group(2)) / (1000.0 if match.group(3) == "ms" else 1.0)
    if value <= 0:
        raise ValueError(f"bad SLO {text!r}: the bound must be above 0")
    return Slo(match.group(1), value)
