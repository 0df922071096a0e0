"""The long-lived services an API process holds (on `app.state.services`), built once from settings.

One typed field per component. `build_services` fills every field it can from settings; whoever runs or
knows the workers publishes the rest after building (`lorahost serve` / `lorahost api`, tests):
  worker_directory  cluster.membership.WorkerDirectory the live workers are read from (None: no worker yet)
  internal_token    the workers' bearer token (None: settings.internal_token)
  worker_transport  the in-process worker of embedded mode (`lorahost serve`): requests routed to it skip
                    the loopback HTTP hop
  worker_client     created in the app lifespan (it owns its connection pool) unless one is set beforehand
Assign a field to replace a component (a fake tokenizer, a clock-driven rate limiter or cache).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from api.base_tokenizers import CatalogTokenizers
from api.caches import ResolvedModel, TenantAuth, TtlCache
from api.console.session import derive_console_secret
from api.inference.learned_predictor import make_length_predictor
from api.inference.predict import MaxTokensPredictor, OutputLengthPredictor
from api.inference.structured import StructuredChecker
from api.live_workers import live_workers
from api.metering import UsageLedger
from api.metrics import ApiMetrics
from api.prompting import BaseModelTokenizer, load_base_tokenizer
from api.ratelimit import InMemoryRateLimiter, RateLimiter
from api.redis_ratelimit import RedisRateLimiter, async_redis_client
from api.scaling_view import ScalingView
from api.sliding_ratelimit import InMemorySlidingLimiter, RedisSlidingLimiter, SlidingWindowLimiter
from api.usage_spool import UsageSpool, spool_path
from api.worker_client import LocalWorkerTransport, WorkerClient
from cluster.membership import WorkerDirectory, WorkerRecord
from cluster.model_refusals import ModelStartRefusals
from cluster.routing_table import CachedRoutingTable
from cluster.waiting_requests import LocalWaitingRequests, RedisWaitingRequests, WaitingRequests
from cluster.worker_listing import CachedWorkerListing
from jobs.dispatch import JobDispatcher, make_job_dispatcher
from jobs.placement import make_routing_table_store
from jobs.plan_runner import PlanRunner, make_plan_runner
from registry import keys
from registry.adapter_pipeline import AdapterJobContext, limits_from_settings
from registry.blob_locations import make_blob_store
from registry.db import make_engine, make_session_factory
from registry.storage import BlobStore
from scheduler.routing.router import Router, RouterOptions
from scheduler.routing.router_policies import make_router
from settings import Settings


@dataclass
class Services:
    """Everything routes use besides the request."""

    settings: Settings
    session_factory: sessionmaker[Session]
    blob_store: BlobStore
    job_context: AdapterJobContext
    jobs: JobDispatcher
    # capacity-plan jobs (POST /v1/admin/plan): child processes of this process, or Celery tasks
    plan_runner: PlanRunner
    # the inference path (api/inference/)
    tokenizer: BaseModelTokenizer | None  # the configured base model's (None: none configured)
    catalog_tokenizers: CatalogTokenizers  # the catalog models' (api/base_tokenizers.py)
    rate_limiter: RateLimiter  # Redis when settings.storage.redis_url, else in memory
    metrics: ApiMetrics  # worker gauges read from worker_directory at scrape time
    usage_ledger: UsageLedger
    auth_cache: TtlCache[str, TenantAuth]  # verified keys (settings.api.auth_cache_ttl_s)
    model_cache: TtlCache[
        tuple[str, str], ResolvedModel
    ]  # (tenant id, model) (settings.api.model_cache_ttl_s)
    router: Router  # the routing policy (settings.routing.policy)
    # the published placement (cluster/routing_table.py), refreshed every settings.routing.table_refresh_s by
    # the app lifespan; prepare.py reads RouteRequest.assigned_workers from this in-memory copy
    routing_table: CachedRoutingTable
    # requests waiting in cold starts on every API replica (the scale-from-zero signal)
    waiting_requests: WaitingRequests
    # the autoscaling decisions over the routing table, the live workers and the waiters (api/scaling_view.py)
    scaling: ScalingView
    # the output-length prediction (api/inference/predict.py): settings.predictor.length_predictor (build_services); the
    # usage ledger tells it each finished request's true length (observe_output)
    predictor: OutputLengthPredictor = field(default_factory=MaxTokensPredictor)
    # the live workers of a shared (Redis) directory, read once per settings.resolved_worker_view_cache_s()
    worker_listing: CachedWorkerListing = field(default_factory=lambda: CachedWorkerListing(0.5))
    admin_key_hash: str | None = None
    # the console's sign-in attempts per client address (settings.api.console_max_sign_ins_per_min): a sliding
    # window, Redis when settings.storage.redis_url
    sign_in_limiter: SlidingWindowLimiter = field(default_factory=InMemorySlidingLimiter)
    # signs console sessions and CSRF tokens (api/console/session.py derive_console_secret)
    console_secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    # structured outputs: constraints compiled against each base model's tokenizer before queueing (cached)
    structured: StructuredChecker = field(default_factory=StructuredChecker)
    engine: Engine | None = None
    # published by whoever runs or knows the workers (see the module docstring)
    worker_directory: WorkerDirectory | None = None
    internal_token: str | None = None
    worker_transport: LocalWorkerTransport | None = None
    worker_client: WorkerClient | None = None
    # why a base model's worker cannot start (written by `lorahost serve`'s model pool; read by cold starts)
    model_refusals: ModelStartRefusals = field(default_factory=ModelStartRefusals)

    def resolved_internal_token(self) -> str | None:
        """The token sent to workers: the published one, else settings.internal_token (read at send time)."""
        return self.internal_token or self.settings.internal_token

    def close(self) -> None:
        """Stop the usage writer (its queued rows are written) and release connections (engine owned by these
        services only)."""
        self.usage_ledger.close()
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
        engine = make_engine(settings.resolved_database_url(), settings.storage.database_pool_size)
        session_factory = make_session_factory(engine)
    blob_store = blob_store or make_blob_store(settings)
    ctx = AdapterJobContext(
        settings=settings,
        session_factory=session_factory,
        blob_store=blob_store,
        limits=limits_from_settings(settings),
    )
    services: Services  # read at call time by the collectors below, once assigned

    def list_workers() -> list[WorkerRecord]:
        return live_workers(services.worker_directory, services.worker_listing)

    metrics = ApiMetrics(list_workers=list_workers)
    routing_table = CachedRoutingTable(make_routing_table_store(settings))
    waiting_requests = make_waiting_requests(settings)
    admin_key_hash = None if settings.api.admin_key else keys.read_admin_key_hash(settings.data_dir)
    services = Services(
        settings=settings,
        session_factory=session_factory,
        blob_store=blob_store,
        job_context=ctx,
        jobs=jobs or make_job_dispatcher(settings, ctx),
        plan_runner=make_plan_runner(settings, session_factory),
        tokenizer=load_base_tokenizer(settings.base_model_path),
        catalog_tokenizers=CatalogTokenizers(
            session_factory, blob_store, settings.data_dir / "tokenizers", settings.api.model_cache_ttl_s
        ),
        rate_limiter=make_rate_limiter(settings),
        metrics=metrics,
        usage_ledger=UsageLedger(
            session_factory,
            metrics,
            api_instance_id=settings.api.resolved_api_instance_id(),
            checkpoint_interval_s=settings.metering.checkpoint_interval_s,
            renewal_interval_s=settings.metering.renewal_interval_s,
            renew_slots=lambda slots: services.rate_limiter.renew_slots(slots),
            spool=UsageSpool(spool_path(settings.data_dir, settings.api.resolved_api_instance_id())),
            observe_output=lambda tenant_id, key, num_tokens: observe_output(
                services.predictor, tenant_id, key, num_tokens
            ),
        ),
        auth_cache=TtlCache(
            settings.api.auth_cache_ttl_s, max_stale_s=settings.api.cache_stale_on_db_outage_s
        ),
        model_cache=TtlCache(
            settings.api.model_cache_ttl_s, max_stale_s=settings.api.cache_stale_on_db_outage_s
        ),
        router=make_router(settings.routing.policy, router_options(settings)),
        routing_table=routing_table,
        waiting_requests=waiting_requests,
        scaling=ScalingView(settings, metrics, routing_table, waiting_requests, list_workers),
        predictor=make_length_predictor(settings, blob_store),
        admin_key_hash=admin_key_hash,
        sign_in_limiter=make_sign_in_limiter(settings),
        console_secret=derive_console_secret(
            settings.api.console_secret, settings.api.admin_key or admin_key_hash
        ),
        engine=engine,
        worker_listing=CachedWorkerListing(settings.resolved_worker_view_cache_s()),
    )
    metrics.register_desired_workers(services.scaling.desired_workers)
    return services


def router_options(settings: Settings) -> RouterOptions:
    """What the routing policies read from settings."""
    return RouterOptions(
        slo_tpot_ms=settings.routing.slo_tpot_ms,
        cold_fetch_ms=settings.routing.cold_fetch_ms,
        max_load_gap=settings.routing.max_load_gap,
    )


def observe_output(
    predictor: OutputLengthPredictor, tenant_id: str, adapter_key: str | None, num_output_tokens: int
) -> None:
    """Tell the predictor served now (read at each call: a test or an operator may replace it) a finished
    request's true output length, when it keeps histories (one per tenant and adapter)."""
    observe = getattr(predictor, "observe", None)
    if observe is not None:
        observe(tenant_id, adapter_key, num_output_tokens)


def make_rate_limiter(settings: Settings, clock: Callable[[], float] = time.time) -> RateLimiter:
    """Redis-backed limits shared by every API replica when Redis is configured, else process-local ones; a
    concurrent-request slot not renewed for usage_lease_timeout_s stops counting (its holder is gone)."""
    if settings.storage.redis_url:
        import redis

        return RedisRateLimiter(
            redis.Redis.from_url(settings.storage.redis_url),
            async_client_factory=partial(
                async_redis_client, settings.storage.redis_url, settings.storage.redis_max_connections
            ),
            key_prefix=f"{settings.jobs.celery_key_prefix}lorahost:rl:",
            clock=clock,
            slot_lease_s=settings.metering.lease_timeout_s,
        )
    return InMemoryRateLimiter(clock, slot_lease_s=settings.metering.lease_timeout_s)


def make_sign_in_limiter(settings: Settings, clock: Callable[[], float] = time.time) -> SlidingWindowLimiter:
    """The console's sign-in limiter: shared by every API replica in Redis when configured, else this process's."""
    if settings.storage.redis_url:
        import redis

        return RedisSlidingLimiter(
            redis.Redis.from_url(settings.storage.redis_url),
            key_prefix=f"{settings.jobs.celery_key_prefix}lorahost:sign-in:",
            clock=clock,
        )
    return InMemorySlidingLimiter(clock)


def make_waiting_requests(settings: Settings) -> WaitingRequests:
    """Shared across API replicas in Redis when configured, else this process's counts."""
    if settings.storage.redis_url:
        import redis

        prefix = f"{settings.jobs.celery_key_prefix}{settings.placement.key_prefix}waiting:"
        return RedisWaitingRequests(redis.Redis.from_url(settings.storage.redis_url), prefix)
    return LocalWaitingRequests()
