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
    # vLLM extensions (not in OpenAI's API): ignore_eos keeps generating past the end-of-sequence token;
    # min_tokens is honoured only when trivially true (0, or ignore_eos without stop strings: the completion
    # then always has max_tokens tokens) because the engine has no min_tokens of its own.
    ignore_eos: bool = False
    min_tokens: int | None = Field(default=None, ge=0)
    # Structured outputs (api/inference/structured.py): OpenAI's response_format, vLLM's structured_outputs and
    # its classic guided_* names.
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # Accepted only at their no-op values (the route refuses anything else, naming the field).
    n: int | None = None
    logprobs: Any = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    @field_validator("seed")
    @classmethod
    def _seed_in_range(cls, seed: int | None) -> int | None:
        if seed is not None and not 0 <= seed <= MAX_SEED:
            raise ValueError(f"seed must be an integer from 0 to {MAX_SEED} (2^64 - 1), got {seed}")
        return seed

    def stop_list(self) -> list[str]:
        """`stop` as a list (OpenAI allows one string or up to 4)."""
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(InferenceRequestBase):
    """POST /v1/completions: `prompt` is a string, a list of one string, or token ids."""

    prompt: str | list[str] | list[int] | list[list[int]]
    best_of: int | None = None
    echo: bool | None = None
    suffix: str | None = None


class ChatCompletionRequest(InferenceRequestBase):
    """POST /v1/chat/completions: `messages` rendered with the base model's chat template."""

    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = Field(default=None, ge=1)
    top_logprobs: int | None = None
    tools: list[Any] | None = None  # with tool_choice: api/inference/tools.py
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    parallel_tool_calls: bool | None = None
