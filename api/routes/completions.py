"""OpenAI-compatible inference: /v1/completions, /v1/chat/completions, /v1/adapters/{name}/completions.

`model` is an adapter name (its latest ready version), `name@N` (a pinned version) or the base model name
(no adapter). One request = one worker generation = exactly one usage row (see api/metering.py). This
module is the thin router that runs the steps of api/inference/ in order:
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

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.caches import TenantAuth
from api.deps import InferenceTenant, ServicesDep
from api.disconnect import ClientDisconnected, run_until_disconnect
from api.errors import ApiError
from api.inference.predict import predict
from api.inference.prepare import Kind, prepare
from api.inference.respond import collect, streaming_response
from api.inference.route import start
from api.inference.schemas import ChatCompletionRequest, CompletionRequest
from api.metering import record_quietly
from api.openapi import json_request_body
from api.prompting import PromptError
from api.request_text import TextCheckedRoute
from api.services import Services
from api.worker_client import WorkerStream
from registry.errors import RegistryError

router = APIRouter(prefix="/v1", tags=["completions"], route_class=TextCheckedRoute)

CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that left before the response (never received)


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


async def serve(
    request: Request,
    tenant: TenantAuth,
    services: Services,
    kind: Kind,
    path_model: str | None = None,
) -> Any:
    """Run one inference request end to end, metering it exactly once."""
    ledger = services.usage_ledger
    meter = ledger.start(tenant.tenant_id)
    upstream: WorkerStream | None = None
    try:
        prepared = await prepare(request, tenant, services, meter, kind, path_model)
        predict(prepared, services.predictor, meter)
        ledger.open(
            meter, is_checkpointed=prepared.is_stream
        )  # in_progress row, written during routing+prefill
        upstream = await start(services, prepared, meter, request.receive)
        await ledger.wait_opened(meter)  # durable before the first token is sent (api/metering.py)
    except ClientDisconnected:  # left while waiting for a worker: nothing was generated
        await ledger.record(meter, "aborted", "the client disconnected while waiting for a worker")
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    except (ApiError, RegistryError, PromptError) as exc:
        await ledger.record(meter, "rejected", _message(exc))
        raise _as_api_error(exc) from exc
    except Exception as exc:
        await record_quietly(ledger, meter, "error", f"internal error: {exc!r}")
        raise
    except anyio.get_cancelled_exc_class():  # the client went away: its open row must not stay open
        with anyio.CancelScope(shield=True):
            if upstream is not None:
                await upstream.aclose()
            await record_quietly(
                ledger, meter, "aborted", "the client disconnected before the response started"
            )
        raise
    if prepared.is_stream:
        return streaming_response(prepared, upstream, meter, ledger)
    try:
        return await run_until_disconnect(request.receive, lambda: collect(prepared, upstream, meter, ledger))
    except ClientDisconnected:  # collect aborted the worker request and metered it `aborted`
        return Response(status_code=CLIENT_CLOSED_REQUEST)  # nobody reads it: for the access log


def _message(exc: Exception) -> str:
    return getattr(exc, "message", None) or str(exc)


def _as_api_error(exc: Exception) -> Exception:
    if isinstance(exc, PromptError):
        return ApiError(400, "invalid_request", str(exc))
    return exc
