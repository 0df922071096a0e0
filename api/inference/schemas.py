"""The OpenAI-compatible request shapes of /v1/completions and /v1/chat/completions."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class StreamOptions(BaseModel):
    """`stream_options` of a streamed request."""

    include_usage: bool = False


MAX_SEED = 2**64 - 1  # the engine seeds torch.Generator.manual_seed, which takes 64-bit seeds


class InferenceRequestBase(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions. Unknown fields are kept (extra="allow")
    so the route can name them in its 400 instead of silently ignoring them."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0, allow_inf_nan=False)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0, allow_inf_nan=False)
    # token id (a string, as JSON keys are) -> a value in [-100, 100] added to its logit; ids are checked
    # against the base model's vocabulary once the model is known (api/inference/sampling_fields.py)
    logit_bias: dict[str, float] | None = None
    # vLLM extensions (not in OpenAI's API, same names and meaning as vLLM's): ignore_eos keeps generating
    # past the end-of-sequence token; min_tokens holds back EOS, stop_token_ids and stop strings until that
    # many tokens were generated; repetition_penalty (> 0, 1 = off) scales the logits of tokens seen in the
    # prompt or output; stop_token_ids end the completion at any of these ids.
    ignore_eos: bool = False
    min_tokens: int | None = Field(default=None, ge=0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, allow_inf_nan=False)
    stop_token_ids: list[int] | None = None
    # `n` choices of one prompt (api/inference/choices.py); the plan's max_n caps it (api/plan_limits.py).
    n: int | None = Field(default=None, ge=1)

    # Structured outputs (api/inference/structured.py): OpenAI's response_format, vLLM's structured_outputs and
    # its classic guided_* names.
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    @field_validator("logit_bias")
    @classmethod
    def _bias_in_range(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for token, value in (bias or {}).items():
            if not token.isdigit():
                raise ValueError(f"keys must be token ids (non-negative integers as strings), got {token!r}")
            if not -100.0 <= value <= 100.0:
                raise ValueError(f"values must be in [-100, 100], got {value} for token {token}")
        return bias

    @field_validator("seed")
    @classmethod
    def _seed_in_range(cls, seed: int | None) -> int | None:
        if seed is not None and not 0 <= seed <= MAX_SEED:
            raise ValueError(f"seed must be an integer from 0 to {MAX_SEED} (2^64 - 1), got {seed}")
        return seed

    @property
    def num_choices(self) -> int:
        """How many choices the request asks for (`n`, 1 when unset)."""
        return self.n or 1

    @property
    def num_sequences(self) -> int:
        """How many sequences are generated for it: its choices (completions' best_of may ask for more)."""
        return self.num_choices

    def stop_list(self) -> list[str]:
        """`stop` as a list (OpenAI allows one string or up to 4)."""
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(InferenceRequestBase):
    """POST /v1/completions: `prompt` is a string, a list of one string, or token ids."""

    prompt: str | list[str] | list[int] | list[list[int]]
    # OpenAI's legacy logprobs: each token's logprob and this many top alternatives (OpenAI allows up to 5;
    # this server up to 20, as vLLM)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    # generate best_of sequences, return the n best (>= n; not streamed: api/inference/choices.py)
    best_of: int | None = Field(default=None, ge=1)
    echo: bool | None = None
    suffix: str | None = None

    @property
    def num_sequences(self) -> int:
        """best_of (n when unset; check_best_of refuses one below n)."""
        return max(self.best_of or 1, self.num_choices)


class ChatCompletionRequest(InferenceRequestBase):
    """POST /v1/chat/completions: `messages` rendered with the base model's chat template."""

    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[Any] | None = None  # with tool_choice: api/inference/tools.py
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    parallel_tool_calls: bool | None = None
