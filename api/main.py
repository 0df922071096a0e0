"""The FastAPI app factory. `create_app(settings)` builds everything from settings in the lifespan.

Extensible: later features add routers (`routers=`/`extra_routers=`), services as typed fields of
`api.services.Services`, and anything else on `app.state`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from api.console.router import install_console
from api.deps import MetricsAccessDep
from api.errors import install_error_handlers
from api.inference.learned_predictor import LearnedLengthPredictor
from api.loop_lag import watch_loop_lag
from api.request_text import TextCheckedRoute
from api.routes import (
    adapters,
    admin,
    base_models,
    completions,
    health,
    keys,
    models,
    placement,
    plan,
    predictor,
    reports,
    usage,
)
from api.services import Services, build_services
from api.worker_client import WorkerClient
from jobs.placement import http_dropper
from jobs.usage_sweep import PeriodicJob, sweep_usage
from registry.placement_job import run_placement
from registry.plan_jobs import fail_plan_jobs_of_owner
from registry.predictor_training import run_predictor_training
from registry.upload_sweeper import run_upload_sweeps
from settings import Settings

# /metrics holds aggregate counters and worker ids (no tenant, adapter or key data). Worker ids describe the
# deployment, so by default it needs the admin key or settings.api.metrics_token (a Prometheus scrape config's
# `authorization: {credentials: ...}`); settings.api.is_metrics_public opens it for private-network setups.
metrics_router = APIRouter(tags=["metrics"], route_class=TextCheckedRoute)


@metrics_router.get("/metrics", include_in_schema=False)
def metrics(request: Request, _: MetricsAccessDep) -> Response:
    """Prometheus text exposition of the API's metrics and the live workers' gauges."""
    body = request.app.state.services.metrics.render()
    return Response(body, media_type=CONTENT_TYPE_LATEST)


# Routes are matched in order, one by one: the inference routes (most of the requests) come first, so a
# completion is matched after 5 candidates instead of 29 (no other route matches their paths).
DEFAULT_ROUTERS: tuple[APIRouter, ...] = (
    completions.router,
    health.router,
    admin.router,
    base_models.router,
    adapters.router,
    keys.router,
    models.router,
    usage.router,
    reports.router,
    predictor.router,
    placement.router,
    plan.router,
    metrics_router,
)


def create_app(
    settings: Settings,
    *,
    services: Services | None = None,
    routers: Sequence[APIRouter] = DEFAULT_ROUTERS,
    extra_routers: Sequence[APIRouter] = (),
) -> FastAPI:
    """The API app. Services are built from `settings` at startup unless passed in (tests, embedding)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned = services is None
        app.state.services = services or build_services(settings)
        worker_client = _open_worker_client(app.state.services)
        _fail_abandoned_plan_jobs(app.state.services)
        started = (
            _start_usage_sweep(app.state.services),
            _start_upload_sweep(app.state.services),
            _start_predictor_reload(app.state.services),
            _start_predictor_training(app.state.services),
            _start_routing_table_refresh(app.state.services),
            _start_placement(app.state.services),
        )
        timers = [timer for timer in started if timer is not None]
        lag_watch = asyncio.create_task(watch_loop_lag(app.state.services.metrics))
        serving_heap = getattr(app.state, "serving_heap", None)  # set by api/http_server.py when served
        if serving_heap is not None:
            app.state.services.metrics.register_gc_pauses(serving_heap)
        try:
            yield
        finally:
            lag_watch.cancel()
            app.state.services.plan_runner.close()  # running plans' child processes are killed now
            for timer in timers:
                timer.stop()
            if worker_client is not None:
                await worker_client.aclose()
                app.state.services.worker_client = None
            app.state.services.usage_ledger.close()  # queued usage rows are written
            await app.state.services.rate_limiter.aclose()  # this loop's Redis connections
            if owned:
                app.state.services.close()

    app = FastAPI(title="lorahost", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings
    install_error_handlers(app)
    for router in (*routers, *extra_routers):
        app.include_router(router)
    if settings.api.is_console_enabled:
        install_console(app)
    return app


def _start_usage_sweep(services: Services) -> PeriodicJob | None:
    """With inline jobs, close the open usage rows of dead workers and expired leases on a timer (Celery beat
    does it otherwise)."""
    settings = services.settings
    if not settings.jobs.is_inline_jobs or settings.jobs.usage_sweep_interval_s <= 0:
        return None
    return PeriodicJob(
        "usage-sweep",
        settings.jobs.usage_sweep_interval_s,
        lambda: _sweep_usage(services),
    ).start()


def _start_upload_sweep(services: Services) -> PeriodicJob | None:
    """With inline jobs, fail stale versions and delete orphaned upload blobs on a timer (registry/upload_sweeper.py;
    Celery beat does it otherwise)."""
    settings = services.settings
    if not settings.jobs.is_inline_jobs or settings.jobs.upload_sweep_interval_s <= 0:
        return None
    return PeriodicJob(
        "upload-sweep", settings.jobs.upload_sweep_interval_s, lambda: run_upload_sweeps(services.job_context)
    ).start()


def _start_predictor_reload(services: Services) -> PeriodicJob | None:
    """Load the newest length predictor artifact now and then every settings.predictor.reload_interval_s, on a
    timer thread (never on the request path); none for another predictor or an interval of 0."""
    interval_s = services.settings.predictor.reload_interval_s
    if not isinstance(services.predictor, LearnedLengthPredictor) or interval_s <= 0:
        return None
    return PeriodicJob(
        "predictor-reload", interval_s, services.predictor.reload, is_run_at_start=True
    ).start()


def _start_predictor_training(services: Services) -> PeriodicJob | None:
    """With inline jobs, train the length predictor on recent usage on a timer (Celery beat does it otherwise)."""
    settings = services.settings
    if not settings.jobs.is_inline_jobs or settings.jobs.predictor_training_interval_s <= 0:
        return None
    return PeriodicJob(
        "predictor-training", settings.jobs.predictor_training_interval_s, lambda: _train_predictor(services)
    ).start()


def _start_routing_table_refresh(services: Services) -> PeriodicJob:
    """Read the published routing table into memory now and every settings.routing.table_refresh_s (a failed
    read keeps the last copy), publish this server's cold-start waiters for the autoscaler and sample the
    scaling decisions (the console's history)."""

    def refresh() -> None:
        services.routing_table.refresh()
        services.scaling.sample()  # publishes this server's waiters and keeps the decisions for the console

    return PeriodicJob(
        "routing-table-refresh", services.settings.routing.table_refresh_s, refresh, is_run_at_start=True
    ).start()


def _start_placement(services: Services) -> PeriodicJob | None:
    """With inline jobs, compute and publish the placement on a timer (Celery beat does it otherwise)."""
    settings = services.settings
    if not settings.jobs.is_inline_jobs or settings.jobs.placement_interval_s <= 0:
        return None
    return PeriodicJob("placement", settings.jobs.placement_interval_s, lambda: place(services)).start()


def place(services: Services) -> None:
    """One inline placement run; this process's cached copy is refreshed at once."""
    # The directory and the token are read at each run: whoever runs the workers publishes them after startup.
    drop = http_dropper(services.resolved_internal_token())
    store = services.routing_table.store
    run_placement(services.session_factory, services.worker_directory, store, services.settings, drop=drop)
    services.routing_table.refresh()


def _train_predictor(services: Services) -> None:
    """One inline training; this process then serves the new model at once (when it reloads models at all)."""
    run = run_predictor_training(services.session_factory, services.blob_store, services.settings)
    predictor = services.predictor
    is_reloading = services.settings.predictor.reload_interval_s > 0
    if run is not None and is_reloading and isinstance(predictor, LearnedLengthPredictor):
        predictor.reload()


def _fail_abandoned_plan_jobs(services: Services) -> None:
    """Fail the plan jobs a previous embedded process of this API instance left queued or running (it died)."""
    if services.plan_runner.name != "embedded":
        return
    with services.session_factory() as session:
        fail_plan_jobs_of_owner(session, services.settings.api.resolved_api_instance_id())


def _sweep_usage(services: Services) -> None:
    # The directory is read at each run: whoever runs the workers publishes it after startup.
    sweep_usage(services.session_factory, services.worker_directory, services.settings)


def _open_worker_client(services: Services) -> WorkerClient | None:
    """Give the services a worker client for this app's lifetime (None if one was passed in)."""
    if services.worker_client is not None:
        return None
    client = WorkerClient.create(
        services.resolved_internal_token,
        local=services.worker_transport,
        router=services.router,
        max_connections=services.settings.api.max_worker_connections,
        read_timeout_s=services.settings.api.worker_read_timeout_s,
    )
    services.worker_client = client
    return client
