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
from registry.model_pages import model_page
from registry.pages import MAX_PAGE_SIZE, PageRequest

router = APIRouter(prefix="/console", route_class=ConsoleRoute, include_in_schema=False)


@router.get("/playground", response_class=HTMLResponse)
def playground_page(
    request: Request, user: ConsoleTenant, db: SessionDep, adapter: str | None = None
) -> Response:
    """The playground form: the adapters the tenant can call by name (its own and public ones with a ready
    version, as /v1/models lists them), the first MAX_PAGE_SIZE by name."""
    page = model_page(db, user.tenant_id or "", [], PageRequest(limit=MAX_PAGE_SIZE))
    adapters = [a for a, _ in page.adapters]
    return render(request, "playground.html", user, adapters=adapters, chosen=adapter)


@router.post("/playground/chat")
async def playground_chat(
    request: Request, _: CsrfChecked, user: ConsoleTenant, services: ServicesDep
) -> Any:
    """An OpenAI chat completion body (the page sends `stream: true`) run as the signed-in tenant."""
    tenant = await run_in_threadpool(tenant_auth_for, services, user)
    return await serve(request, tenant, services, "chat")
