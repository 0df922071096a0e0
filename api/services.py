"""The long-lived services an API process holds (on `app.state.services`), built once from settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from api.caches import TtlCache
from api.metering import UsageLedger
from api.metrics import ApiMetrics
from api.prompting import load_base_tokenizer
from jobs.dispatch import JobDispatcher, make_job_dispatcher
from registry import keys
from registry.adapter_pipeline import AdapterJobContext, limits_from_settings
from registry.db import make_engine, make_session_factory
from cluster.membership import InMemoryWorkerDirectory, WorkerRecord
from api.ratelimit import InMemoryRateLimiter, RateLimiter, RedisRateLimiter
from registry.settings import Settings
from registry.storage import BlobStore, make_blob_store


@dataclass
class Services:
    """Everything routes use besides the request. `extras` is for services added by later features."""

    settings: Settings
    session_factory: sessionmaker[Session]
    blob_store: BlobStore
    job_context: AdapterJobContext
    jobs: JobDispatcher
    admin_key_hash: str | None = None
    engine: Engine | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    def close(self) -> None:
        """Stop the usage writer (its queued rows are written) and release connections (engine owned by these
        services only)."""
        ledger = self.extras.get("usage_ledger")
        if ledger is not None:
            ledger.close()
        if self.engine is not None:
            self.engine.dispose()


def build_services(
    settings: Settings,
    *,
    session_factory: sessionmaker[Session] | None = None,
    blob_store: BlobStore | None = None,
    jobs: JobDispatcher | None = None,
) -> Services:
    """Services from settings; pass any piece to use it instead (tests, embedding)."""
    engine = None
    if session_factory is None:
        engine = make_engine(settings.resolved_database_url())
        session_factory = make_session_factory(engine)
    blob_store = blob_store or make_blob_store(settings)
    ctx = AdapterJobContext(
        settings=settings,
        session_factory=session_factory,
        blob_store=blob_store,
        limits=limits_from_settings(settings),
    )
    services = Services(
        settings=settings,
        session_factory=session_factory,
        blob_store=blob_store,
        job_context=ctx,
        jobs=jobs or make_job_dispatcher(settings, ctx),
        admin_key_hash=None if settings.admin_key else keys.read_admin_key_hash(settings.data_dir),
        engine=engine,
    )
    ensure_inference_services(services)
    return services


# ---- inference services (extras) ----------------------------------------------------------------------
# services.extras keys used by the inference path:
#   "tokenizer"        api.prompting.BaseModelTokenizer | None (None: no base model configured)
#   "rate_limiter"     api.ratelimit.RateLimiter (Redis when settings.redis_url, else in memory)
#   "metrics"          api.metrics.ApiMetrics (worker gauges read from "worker_directory" at scrape time)
#   "usage_ledger"     api.metering.UsageLedger
#   "worker_client"    api.worker_client.WorkerClient (created in the app lifespan: it owns an AsyncClient)
#   "worker_directory" cluster.membership.WorkerDirectory, published by whoever runs/knows the workers
#   "internal_token"   the workers' bearer token (defaults to settings.internal_token)
#   "worker_transport" api.worker_client.LocalWorkerTransport | None: the in-process worker of embedded mode
#                      (published by `lorahost serve`); requests routed to it skip the loopback HTTP hop
#   "auth_cache"       api.caches.TtlCache[str, TenantAuth] (verified keys, settings.auth_cache_ttl_s)
#   "model_cache"      api.caches.TtlCache[(tenant id, model), ResolvedModel] (settings.model_cache_ttl_s)


def make_rate_limiter(settings: Settings) -> RateLimiter:
    """Redis-backed limits shared by every API replica when Redis is configured, else process-local ones."""
    if settings.redis_url:
        import redis

        return RedisRateLimiter(
            redis.Redis.from_url(settings.redis_url), key_prefix=f"{settings.celery_key_prefix}lorahost:rl:"
        )
    return InMemoryRateLimiter()


def live_workers(services: Services) -> list[WorkerRecord]:
    """The live worker records from the published directory (none when no directory is published)."""
    directory = services.extras.get("worker_directory")
    return directory.list_live() if directory is not None else []


def is_in_memory_directory(services: Services) -> bool:
    """True when the worker directory is process-local (cheap enough to read on the event loop)."""
    return isinstance(services.extras.get("worker_directory"), InMemoryWorkerDirectory | None)


def ensure_inference_services(services: Services) -> None:
    """Fill in the inference extras that are missing (idempotent; pass your own to replace any)."""
    extras = services.extras
    if "tokenizer" not in extras:
        extras["tokenizer"] = load_base_tokenizer(services.settings.base_model_path)
    if "rate_limiter" not in extras:
        extras["rate_limiter"] = make_rate_limiter(services.settings)
    if "metrics" not in extras:
        extras["metrics"] = ApiMetrics(list_workers=lambda: live_workers(services))
    if "auth_cache" not in extras:
        extras["auth_cache"] = TtlCache(services.settings.auth_cache_ttl_s)
    if "model_cache" not in extras:
        extras["model_cache"] = TtlCache(services.settings.model_cache_ttl_s)
    if "usage_ledger" not in extras:
        extras["usage_ledger"] = UsageLedger(
            services.session_factory,
            extras["metrics"],
            api_instance_id=services.settings.resolved_api_instance_id(),
            checkpoint_interval_s=services.settings.usage_checkpoint_interval_s,
        )
