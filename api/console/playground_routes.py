"""The playground: one prompt, the adapter's answer streamed beside the base model's. Each side is an ordinary
chat completion of the signed-in tenant (api/inference/serve.py `serve`, as /v1/chat/completions): the same checks, rate limits,
scheduling and metering as the REST API, billed to the tenant like any request."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from starlette.concurrency import run_in_threadpool

from api.console.auth import ConsoleTenant, CsrfChecked, tenant_auth_for
from api.console.security import ConsoleRoute
from api.console.templating import render
from api.deps import ServicesDep, SessionDep
from api.inference.serve import serve
from registry import repository

router = APIRouter(prefix="/console", route_class=ConsoleRoute, include_in_schema=False)


@router.get("/playground", response_class=HTMLResponse)
def playground_page(
    request: Request, user: ConsoleTenant, db: SessionDep, adapter: str | None = None
) -> Response:
    """The playground form: the tenant's ready adapters and public ones it may use."""
    adapters = [
        a for a in repository.list_visible_adapters(db, user.tenant_id or "")
        if any(v.status == "ready" for v in a.versions)
    ]  # fmt: skip
    return render(request, "playground.html", user, adapters=adapters, chosen=adapter)


@router.post("/playground/chat")
async def playground_chat(
    request: Request, _: CsrfChecked, user: ConsoleTenant, services: ServicesDep
) -> Any:
    """An OpenAI chat completion body (the page sends `stream: true`) run as the signed-in tenant."""
    tenant = await run_in_threadpool(tenant_auth_for, services, user)
    return await serve(request, tenant, services, "chat")
