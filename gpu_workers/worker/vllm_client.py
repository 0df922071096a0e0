"""What `VllmBackend` (gpu_workers/worker/vllm_backend.py) sends vLLM: the part of `AsyncLLM` it calls
(`VllmClient`, so tests drive the backend with a fake), the integer adapter ids (`LoraIds`) and the prompt with the
tenant's prefix-cache salt (`engine_prompt_of`). No vllm import: vllm_engine.py builds the real client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol


class VllmClient(Protocol):
    """What this backend calls on vLLM's `AsyncLLM` (vllm/v1/engine/async_llm.py)."""

    def generate(
        self, prompt: Any, sampling_params: Any, request_id: str, *, lora_request: Any = None
    ) -> AsyncIterator[Any]:
        """Outputs of one request (cumulative token ids in `outputs[0].token_ids`)."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop a request."""
        ...

    async def add_lora(self, lora_request: Any) -> bool:
        """Load an adapter into vLLM's adapter cache."""
        ...

    async def remove_lora(self, lora_id: int) -> bool:
        """Drop an adapter."""
        ...

    def shutdown(self) -> None:
        """Stop the engine process."""
        ...


def engine_prompt_of(prompt: str | list[int], cache_namespace: str | None) -> dict[str, Any]:
    """vLLM's prompt for a request: its tokens (or text) and, for a tenant's request, its prefix-cache namespace
    as vLLM's `cache_salt` (vLLM reuses cached KV blocks only between requests with the same salt, as the native
    engine keeps prefix hits within a namespace: no tenant learns from time to first token what another sent)."""
    engine_prompt: dict[str, Any] = (
        {"prompt_token_ids": prompt} if isinstance(prompt, list) else {"prompt": prompt}
    )
    if cache_namespace is not None:
        engine_prompt["cache_salt"] = cache_namespace
    return engine_prompt


class LoraIds:
    """vLLM's integer adapter ids: one per adapter files (by resolved path, which in the worker's
    content-addressed cache names the content), from 1 up, never reused."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}

    def id_for(self, path: Path) -> int:
        """The id of the files at `path` (a new one for files never seen)."""
        key = str(Path(path).resolve())
        if key not in self._ids:
            self._ids[key] = len(self._ids) + 1
        return self._ids[key]
