"""One inference request end to end (the REST completions routes and the console's playground call it): prepare
-> predict -> route to a worker -> respond, metered exactly once (module doc of api/routes/completions.py).

It takes the ASGI request, unlike the actions of api/actions/: the body is read only after the request has
been charged on arrival (api/inference/prepare.py), and the receive channel is watched for a client that
leaves (api/disconnect.py) while the answer streams."""

from __future__ import annotations

from typing import Any

import anyio
from fastapi import Request
from fastapi.responses import Response

from api.caches import TenantAuth
from api.disconnect import ClientDisconnected, run_until_disconnect
from api.errors import ApiError
from api.inference.choice_streams import ChoiceStreams
from api.inference.predict import predict
from api.inference.prepare import Kind, prepare
from api.inference.respond import collect, streaming_response
from api.inference.route import start
from api.metering import record_quietly
from api.prompting import PromptError
from api.services import Services
from registry.errors import RegistryError

CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that left before the response (never received)


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
    upstream: ChoiceStreams | None = None
    try:
        prepared = await prepare(request, tenant, services, meter, kind, path_model)
        predict(prepared, services.predictor, meter)
        meter.mark("prepare")
        ledger.open(
            meter, is_checkpointed=prepared.is_stream
        )  # in_progress row, written during routing+prefill
        upstream = await start(services, prepared, meter, request.receive)
        meter.mark("route")
        await ledger.wait_opened(meter)  # durable before the first token is sent (api/metering.py)
        meter.mark("durable")
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
