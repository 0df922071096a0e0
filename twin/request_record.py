"""`RequestRecord`: what happened to one request, in the same shape for the real engine and the twin (the
fidelity benchmark compares the two record lists with `twin/run_metrics.py`)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field


@dataclass
class RequestRecord:
    """Times are seconds on the run's clock; `token_times` one per output token (when it was produced)."""

    request_id: str
    arrival_s: float
    num_prompt_tokens: int
    adapter_id: str | None = None
    tenant_id: str | None = None
    worker_id: str | None = None
    first_scheduled_s: float | None = None
    finish_s: float | None = None
    finish_reason: str | None = None
    error_code: str | None = None
    token_times: list[float] = field(default_factory=list)

    @property
    def num_output_tokens(self) -> int:
        """Tokens produced."""
        return len(self.token_times)

    @property
    def ttft_s(self) -> float | None:
        """Arrival to first token (None when no token came)."""
        return self.token_times[0] - self.arrival_s if self.token_times else None

    @property
    def queueing_s(self) -> float | None:
        """Arrival to the first step that ran any of its tokens."""
        return None if self.first_scheduled_s is None else self.first_scheduled_s - self.arrival_s

    @property
    def inter_token_s(self) -> list[float]:
        """Gaps between consecutive output tokens."""
        times = self.token_times
        return [b - a for a, b in itertools.pairwise(times)]
