"""OpenAI-compatible inference: /v1/completions, /v1/chat/completions, /v1/adapters/{name}/completions.

`model` is an adapter name (its latest ready version), `name@N` (a pinned version) or the base model name
(no adapter). One request = one worker generation = exactly one usage row (see api/metering.py). This
module is the thin router; api/inference/serve.py runs the steps of api/inference/ in order:
auth -> prepare (parse, refuse unsupported fields, resolve the model, tokenize and size-check the prompt,
rate limit) -> predict the output length -> route to a worker and read its first event (one retry on
another worker, a cold-start wait) -> respond (SSE or one JSON body).
Every refusal after authentication is metered as `rejected` with zero tokens. An admitted request's row is
written `in_progress` while it is routed and prefilled (no token is sent before it is durable) and streams
are checkpointed as they go, so a crash of this process bills what was delivered (api/metering.py).
A client that disconnects aborts the worker request, streamed or not (api/disconnect.py for non-streamed
responses), and is metered `aborted`. Bodies and prompts are bounded before parsing/tokenizing
(api/request_limits.py).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from api.deps import InferenceTenant, ServicesDep
from api.inference.schemas import ChatCompletionRequest, CompletionRequest
from api.inference.serve import serve
from api.openapi import json_request_body
from api.request_text import TextCheckedRoute

router = APIRouter(prefix="/v1", tags=["completions"], route_class=TextCheckedRoute)


@router.post("/completions", openapi_extra=json_request_body(CompletionRequest))
async def create_completion(request: Request, tenant: InferenceTenant, services: ServicesDep) -> Any:
    """Text completion (OpenAI `POST /v1/completions`), plain or streamed."""
    return await serve(request, tenant, services, "text")


@router.post("/chat/completions", openapi_extra=json_request_body(ChatCompletionRequest))
async def create_chat_completion(request: Request, tenant: InferenceTenant, services: ServicesDep) -> Any:
    """Chat completion (OpenAI `POST /v1/chat/completions`), plain or streamed."""
    return await serve(request, tenant, services, "chat")


@router.post("/adapters/{name}/completions", openapi_extra=json_request_body(CompletionRequest))
async def create_adapter_completion(
    name: str, request: Request, tenant: InferenceTenant, services: ServicesDep
) -> Any:
    """Text completion with the adapter in the path (`model` may be omitted, or `name@N` to pin)."""
    return await serve(request, tenant, services, "text", path_model=name)
