"""EngineRequest: one request as the engine core receives it (vLLM's EngineCoreRequest), built once.

The worker builds it in `WorkerService.prepare` from the wire's `GenerateRequest` (tokenized, sampling checked,
adapter leased); it is then the single argument of `InferenceBackend.generate_stream` (the native
`AsyncLLMEngine`, `VllmBackend`) and of `LLMEngine.add_request`, which turns it into the core's `Sequence`
(`new_sequence`). Direct engine users (benchmarks, the profilers, tests) build one themselves. The prompt's
size is judged by one rule, `prompt_size_error`: the worker's prepare refuses with a 400 and the engine keeps
the same rule as its guard for callers that do not go through a worker.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from pathlib import Path

from scheduler.core.sampling import SamplingParams
from scheduler.core.sequence import Sequence


@dataclass(frozen=True)
class EngineRequest:
    """One generate request: its id, prompt token ids, sampling, adapter and scheduling inputs.

    `adapter_id` is the engine's adapter identity (the wire's `AdapterRef.adapter_key`, the adapter version
    id); `adapter_path` a host copy to register first when the engine does not know the adapter yet (direct
    engine use; the worker registers adapters when it leases them). `predicted_output_tokens` is the policy's
    expected output length (None: max_tokens); `tenant_id`, `tenant_weight` the fair-share inputs;
    `cache_namespace` the prefix-cache namespace its blocks are shared in. `arrival_time` is the engine
    clock's arrival (None: stamped when the engine adds it); `received_at` the wall-clock time the worker
    received it (its reported latencies are measured from there; None: direct engine use).
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling_params: SamplingParams
    adapter_id: str | None = None
    _: KW_ONLY
    predicted_output_tokens: int | None = None
    tenant_id: str | None = None
    tenant_weight: float = 1.0
    cache_namespace: str | None = None
    arrival_time: float | None = None
    received_at: float | None = None
    adapter_path: Path | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_token_ids", tuple(map(int, self.prompt_token_ids)))

    @property
    def num_prompt_tokens(self) -> int:
        """Length of the prompt."""
        return len(self.prompt_token_ids)


def prompt_size_error(num_prompt_tokens: int, max_model_len: int) -> str | None:
    """Why a prompt of this many tokens cannot run within max_model_len (it must leave room for one output
    token), saying what to change; None when it can."""
    if num_prompt_tokens == 0:
        return "the prompt is empty; send at least one token"
    if num_prompt_tokens >= max_model_len:
        return (
            f"prompt has {num_prompt_tokens} tokens but this worker's max_model_len is {max_model_len}; "
            f"shorten it to at most {max_model_len - 1} tokens"
        )
    return None


def new_sequence(request: EngineRequest, max_model_len: int, arrival_time: float) -> Sequence:
    """The core's state for a request whose prompt fits (`prompt_size_error` is None), arrived at
    `arrival_time` (the engine clock's): its max_tokens capped by the room max_model_len leaves after the
    prompt."""
    max_tokens = min(request.sampling_params.max_tokens, max_model_len - request.num_prompt_tokens)
    return Sequence(
        request.request_id,
        list(request.prompt_token_ids),
        request.sampling_params,
        request.adapter_id,
        max_tokens,
        request.predicted_output_tokens,
        tenant_id=request.tenant_id,
        tenant_weight=request.tenant_weight,
        arrival_time=arrival_time,
        cache_namespace=request.cache_namespace,
    )
