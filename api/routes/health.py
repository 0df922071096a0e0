"""/v1/live: the process serves (the readiness probe). /v1/health: that plus a database round trip (monitoring,
start order). /v1/ready: whether a worker serves each base model.

/v1/ready is for operators, the demo and smoke tests ("can this platform answer inference now?"); it is not
a Kubernetes readinessProbe for the API itself: requests that arrive with no ready worker wait for one
(api/cold_start.py), and an API taken out of rotation would stop the traffic that scales workers up.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text
from starlette.concurrency import run_in_threadpool

from api.deps import ServicesDep, SessionDep
from api.live_workers import live_workers
from api.request_text import TextCheckedRoute
from api.worker_client import num_ready_workers

router = APIRouter(prefix="/v1", tags=["health"], route_class=TextCheckedRoute)


@router.get("/live")
def live() -> dict[str, str]:
    """`{"status": "ok"}` while this process serves, whatever its database, Redis or S3 do: the readiness probe.
    A probe on a shared dependency would take every replica out of rotation in that dependency's outage, when
    they still serve inference for the keys and adapters they have cached."""
    return {"status": "ok"}


@router.get("/health")
def health(session: SessionDep) -> dict[str, str]:
    """`{"status": "ok"}` when the API can reach its database."""
    session.execute(text("SELECT 1"))
    return {"status": "ok"}


@router.get("/ready", responses={503: {"description": "a base model has no ready worker yet"}})
async def ready(services: ServicesDep) -> Any:
    """200 when at least one ready worker serves each base model this API serves, else 503 (same body)."""
    records = await run_in_threadpool(live_workers, services.worker_directory, services.worker_listing)
    base_models = [services.settings.base_model_name]
    counts = {name: num_ready_workers(name, records) for name in base_models}
    is_ready = all(counts.values())
    body = {
        "status": "ready" if is_ready else "waiting_for_workers",
        "base_models": {name: {"num_ready_workers": n} for name, n in counts.items()},
    }
    return JSONResponse(body, status_code=200 if is_ready else 503)
