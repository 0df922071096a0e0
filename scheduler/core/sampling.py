"""Per-request sampling parameters (validated at construction)."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.core.structured_output import StructuredOutput


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens for one request.

    temperature == 0 means greedy. top_k <= 0 / top_p == 1 disable those filters. `seed` gives the request
    its own torch.Generator so its samples are reproducible regardless of the batch it runs in.
    `stop` strings end generation and are not included in the output text. `structured_output`: what the output
    must match (scheduler/core/structured_output.py); the row then samples only tokens its grammar allows and
    ends (finish_reason "stop") with an end-of-sequence token once the grammar is complete.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    structured_output: StructuredOutput | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids or ()))
        stop = self.stop
        object.__setattr__(self, "stop", (stop,) if isinstance(stop, str) else tuple(stop or ()))
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = disabled), got {self.top_k}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        if self.structured_output is not None and self.ignore_eos:
            raise ValueError(
                "ignore_eos cannot be combined with structured output (a complete output ends with "
                "the end-of-sequence token); drop ignore_eos"
            )

    @property
    def is_greedy(self) -> bool:
        """True when the argmax token is taken."""
        return self.temperature == 0.0
