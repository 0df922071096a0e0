"""What a simulation replays: requests with their arrival time, prompt and output lengths and adapter, and the
adapters they name (rank and device bytes). One shape for a trace, read by the worker and cluster twins and
written by the benchmarks from real traces (../shared/data) or synthetic ones."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TraceRequest:
    """One request: it arrives at `arrival_s`, has `num_prompt_tokens` of prompt and produces exactly
    `num_output_tokens` (the twin replays known lengths: no EOS). `prompt_token_ids` (optional) lets prompts
    share prefixes as in the real trace; without them every prompt is distinct (no prefix-cache hits)."""

    request_id: str
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    adapter_id: str | None = None
    tenant_id: str | None = None
    predicted_output_tokens: int | None = None
    prompt_token_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.num_prompt_tokens < 1 or self.num_output_tokens < 1:
            raise ValueError(f"request {self.request_id!r} needs at least one prompt and one output token")
        if self.prompt_token_ids is not None and len(self.prompt_token_ids) != self.num_prompt_tokens:
            raise ValueError(f"request {self.request_id!r}: prompt_token_ids has the wrong length")


@dataclass(frozen=True)
class AdapterSpec:
    """An adapter a trace names: its rank and the device bytes of its weights; `num_pages` the exact pool
    pages the engine's tensor layout takes (None: cut by rank rows, scheduler/core/page_pool.py)."""

    adapter_id: str
    rank: int
    num_bytes: int
    num_pages: int | None = None
