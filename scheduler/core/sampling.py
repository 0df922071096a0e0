"""Per-request sampling parameters (validated at construction) and the log probabilities a step reports."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduler.core.structured_output import StructuredOutput

MAX_LOGPROBS = 20  # top alternatives per token (OpenAI chat's top_logprobs cap; vLLM's default max_logprobs)
MAX_PENALTY = 2.0  # presence / frequency penalties lie in [-2, 2] (OpenAI)
MAX_LOGIT_BIAS = 100.0  # logit_bias values lie in [-100, 100] (OpenAI)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens for one request.

    temperature == 0 means greedy. top_k <= 0 / top_p == 1 disable those filters. `seed` gives the request
    its own torch.Generator so its samples are reproducible regardless of the batch it runs in.
    `stop` strings end generation and are not included in the output text.

    Logits processors, applied in this order before temperature / top-k / top-p (as vLLM v1 does):
    `min_tokens` masks the stop token ids (and EOS unless `ignore_eos`) while fewer tokens were generated, and
    holds back stop strings too; `logit_bias` (token id -> value added to its logit); `repetition_penalty`
    (vLLM / HF: a logit of a token seen in the prompt or output is divided by it when positive, multiplied when
    negative; 1 = off); `frequency_penalty` (minus penalty x count in the output) and `presence_penalty`
    (minus penalty once a token is in the output), OpenAI's. `logprobs`: report the sampled token's log
    probability and this many top alternatives (0 = the sampled token's only; None = nothing), computed on
    the distribution after the processors and before temperature (vLLM's "processed_logprobs").
    `needs_cumulative_logprob`: sum the sampled tokens' logprobs (the same distribution as `logprobs`) into
    the sequence's cumulative log probability, reported when it finishes, whether or not `logprobs` asks for
    the tokens' own (the API ranks `best_of` sequences by it: api/inference/choices.py).
    `prompt_logprobs`: the same for each prompt token after the first (the model's own distribution: no
    processor applies to the prompt); such a request computes its whole prompt (no prefix-cache reuse).
    `structured_output`: what the output must match (scheduler/core/structured_output.py); the row then samples
    only tokens its grammar allows and ends (finish_reason "stop") with an end-of-sequence token once the
    grammar is complete.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    min_tokens: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = field(default_factory=tuple)
    logprobs: int | None = None
    needs_cumulative_logprob: bool = False
    prompt_logprobs: int | None = None
    structured_output: StructuredOutput | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids or ()))
        stop = self.stop
        object.__setattr__(self, "stop", (stop,) if isinstance(stop, str) else tuple(stop or ()))
        bias = self.logit_bias
        pairs = bias.items() if isinstance(bias, Mapping) else (bias or ())
        object.__setattr__(self, "logit_bias", tuple(sorted((int(t), float(v)) for t, v in pairs)))
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
        self._check_processors()

    def _check_processors(self) -> None:
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (math.isfinite(value) and -MAX_PENALTY <= value <= MAX_PENALTY):
                raise ValueError(f"{name} must be in [-{MAX_PENALTY}, {MAX_PENALTY}], got {value}")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ValueError(f"repetition_penalty must be > 0 (1 = off), got {self.repetition_penalty}")
        for token_id, value in self.logit_bias:
            if token_id < 0 or not (math.isfinite(value) and abs(value) <= MAX_LOGIT_BIAS):
                raise ValueError(
                    f"logit_bias[{token_id}]={value}: token ids must be >= 0 and values in "
                    f"[-{MAX_LOGIT_BIAS}, {MAX_LOGIT_BIAS}]"
                )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_LOGPROBS:
                raise ValueError(f"{name} must be in [0, {MAX_LOGPROBS}], got {value}")
        if self.structured_output is not None and self.ignore_eos:
            raise ValueError(
                "ignore_eos cannot be combined with structured output (a complete output ends with "
                "the end-of-sequence token); drop ignore_eos"
            )

    @property
    def is_greedy(self) -> bool:
        """True when the argmax token is taken."""
        return self.temperature == 0.0

    @property
    def needs_token_logprob(self) -> bool:
        """True when each sampled token's logprob is computed (asked for, or summed into the cumulative)."""
        return self.logprobs is not None or self.needs_cumulative_logprob

    @property
    def has_penalties(self) -> bool:
        """True when a penalty reads the token history (prompt + output)."""
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    def is_stop_held(self, num_output_tokens: int) -> bool:
        """True while min_tokens holds back every stop (stop ids, EOS, stop strings): fewer tokens so far."""
        return num_output_tokens < self.min_tokens


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log probability and the top alternatives [(token id, logprob)], best first
    (empty when the request asked for logprobs=0)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
