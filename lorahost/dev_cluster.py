"""`lorahost dev-cluster`: the distributed topology as local processes, for development, tests and benchmarks.

    with DevCluster(DevClusterConfig(data_dir=tmp, base_model=model_dir)) as cluster:
        cluster.api_urls        # ["http://127.0.0.1:<port>", ...] (2 API replicas)
        cluster.admin_key       # send `Authorization: Bearer <admin key>` to /v1/admin/...
        cluster.kill_worker(0)  # SIGKILL the first worker (kill -9); stop_worker(0) drains it (SIGTERM)
        cluster.start_worker()  # one more worker (a new id), once ready

What runs: `lorahost api` x num_api (each its own port and api_instance_id), `lorahost worker` x
num_workers (each its own port, advertise URL and worker id), one Celery worker with embedded beat
(`celery -A jobs.worker worker --beat`), against PostgreSQL (a fresh database, migrated first and dropped on
stop, unless database_url is given), Redis (every key of this run under one prefix: worker membership,
Celery queue and keys, rate limits; deleted on stop) and S3 (a moto server started here unless s3_endpoint
is given; bucket created). Every child gets the parent's environment (so LORAHOST_* settings such as
LORAHOST_ENGINE_NUM_THREADS pass through), then config.env, then what the cluster owns.
With is_autoscale, lorahost/scaler.py polls `GET /v1/admin/scaling` and starts/stops worker processes.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from lorahost.dev_cluster_commands import (
    api_command,
    child_env,
    jobs_command,
    worker_command,
    worker_engine,
    worker_python,
)
from lorahost.dev_cluster_config import DevClusterConfig
from lorahost.dev_cluster_services import DevServices
from lorahost.processes import (
    ChildProcess,
    free_port,
    http_ok,
    log_contains,
    spawn,
    stop_all,
    wait_until,
)
from lorahost.scaler import ModelWorkers, ProcessScaler, fetch_scaling

log = logging.getLogger("lorahost.dev_cluster")

INTERNAL_READY_PATH = "/internal/v1/ready"


@dataclass
class WorkerHandle:
    """A worker process of the cluster."""

    worker_id: str
    url: str
    process: ChildProcess
    engine: str = "native"
    base_model: str = ""  # the name of the base model it serves


class DevCluster:
    """Start/stop the topology; a context manager. Thread-safe worker start/stop (the scaler runs in a thread)."""

    def __init__(self, config: DevClusterConfig) -> None:
        self.config = config
        self.data_dir = Path(config.data_dir).resolve()
        self.run_id = secrets.token_hex(4)
        self.key_prefix = f"lorahost-dev-{self.run_id}:"
        self.celery_queue = f"lorahost-dev-{self.run_id}"
        self.admin_key = config.admin_key or secrets.token_urlsafe(24)
        self.internal_token = secrets.token_urlsafe(24)
        self.services = DevServices(config, self.data_dir)
        self.apis: list[ChildProcess] = []
        self.jobs: ChildProcess | None = None
        self.scalers: dict[str, ProcessScaler] = {}  # base model -> its scaler (with is_autoscale)
        self._workers: list[WorkerHandle] = []
        self._draining: list[WorkerHandle] = []
        self._num_worker_starts = itertools.count()
        self._api_turn = itertools.count()
        self._lock = threading.RLock()
        self._is_started = False

    # ---- properties --------------------------------------------------------------------------------------

    @property
    def database_url(self) -> str | None:
        """This run's PostgreSQL database (None before start)."""
        return self.services.database_url

    @property
    def api_urls(self) -> list[str]:
        """The API replicas' base URLs."""
        return [api.url or "" for api in self.apis]

    @property
    def api_url(self) -> str:
        """The first API replica."""
        return self.api_urls[0]

    def next_api_url(self) -> str:
        """The API replicas in turn (client-side round robin)."""
        return self.api_urls[next(self._api_turn) % len(self.apis)]

    @property
    def worker_key_prefix(self) -> str:
        """The Redis key prefix of this cluster's worker membership."""
        return f"{self.key_prefix}workers:"

    @property
    def workers(self) -> list[WorkerHandle]:
        """The managed workers that are running or starting (not draining or killed), oldest first."""
        with self._lock:
            return list(self._workers)

    @property
    def scaler(self) -> ProcessScaler | None:
        """The configured base model's scaler (with is_autoscale)."""
        return self.scalers.get(self.config.base_model_name)

    def worker_ids(self) -> list[str]:
        """Ids of `workers`."""
        return [w.worker_id for w in self.workers]

    def model_worker_ids(self, base_model: str) -> list[str]:
        """Ids of the `workers` of one base model (its scaler's view)."""
        return [w.worker_id for w in self.workers if w.base_model == base_model]

    def admin_headers(self) -> dict[str, str]:
        """Authorization header with the admin key."""
        return {"Authorization": f"Bearer {self.admin_key}"}

    # ---- lifecycle ---------------------------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Self:
        """Services, migrations, then every process in parallel; returns once all are healthy (else stops
        what started and raises ChildFailedError / RuntimeError with the reason)."""
        try:
            self.services.start(self._log_path, self.child_env)
            self._spawn_processes()
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        self._is_started = True
        if self.config.is_autoscale:  # one scaler per base model: each scales from zero on its own
            for model in (self.config.base_model_name, *self.config.catalog_models):
                self.scalers[model] = ProcessScaler(
                    lambda model=model: fetch_scaling(self.next_api_url(), self.admin_key, model),  # type: ignore[misc]
                    ModelWorkers(self, model),
                    max_workers=self.config.max_workers,
                    interval_s=self.config.scaler_interval_s,
                ).start()
        return self

    def stop(self) -> dict[str, int]:
        """Stop the scaler, then every process (SIGTERM, drain, SIGKILL after stop_timeout_s), then the
        services of this run; returns name -> exit code. Safe to call twice."""
        for scaler in self.scalers.values():
            scaler.stop()
        self.scalers = {}
        with self._lock:
            children = [*self.apis, *(w.process for w in self._workers + self._draining)]
            children += [self.jobs] if self.jobs else []
            self.apis, self._workers, self._draining, self.jobs = [], [], [], None
        codes = stop_all(children, self.config.stop_timeout_s)
        self.services.stop([f"{self.key_prefix}*", f"*{self.celery_queue}*"])
        return codes

    # ---- workers -----------------------------------------------------------------------------------------

    def start_worker(
        self,
        *,
        worker_id: str | None = None,
        engine: str | None = None,
        base_model: str | None = None,
        port: int | None = None,
        advertise_url: str | None = None,
        wait: bool = True,
    ) -> WorkerHandle:
        """Start one worker process (a new id unless worker_id is given: a restart under the same id) with
        `engine` (default: config.worker_engines in turn, else the environment's) for `base_model` (default the
        configured one; another name: a catalog model, fetched by the worker from the blob store) on `port` (default
        free), registered at `advertise_url` (default its own URL; e.g. a fault proxy in front of it); wait=True
        returns once it is ready (registered in Redis)."""
        index = next(self._num_worker_starts)
        worker_id = worker_id or f"dev-worker-{index}"
        base = self.config.worker_base_port
        port = port or (base + index if base is not None else free_port(self.config.host))
        url = f"http://{self.config.host}:{port}"
        data_dir = self.data_dir / "workers" / f"{worker_id}-{index}"
        env = {**self.child_env(), "LORAHOST_DATA_DIR": str(data_dir)}
        base_model = base_model or self.config.base_model_name
        if base_model != self.config.base_model_name:  # a catalog model: fetched by name, no local path
            env["LORAHOST_BASE_MODEL_NAME"] = base_model
            env.pop("LORAHOST_BASE_MODEL_PATH", None)
        engine = engine or worker_engine(self.config, index, env)
        env["LORAHOST_ENGINE_BACKEND"] = engine
        command = worker_command(
            self.config.host, port, advertise_url or url, worker_id, worker_python(self.config, engine)
        )
        process = spawn(worker_id, command, env, self._log_path(f"{worker_id}-{index}"), url=url)
        handle = WorkerHandle(worker_id, url, process, engine, base_model)
        with self._lock:
            self._workers.append(handle)
        if wait:
            self.wait_worker_ready(handle)
        return handle

    def wait_worker_ready(self, handle: WorkerHandle, timeout_s: float | None = None) -> None:
        """Until the worker's /ready answers 200 (model loaded, registered)."""
        headers = {"Authorization": f"Bearer {self.internal_token}"}
        wait_until(
            handle.process,
            lambda: http_ok(handle.url + INTERNAL_READY_PATH, headers),
            timeout_s or self.config.start_timeout_s,
            "ready",
        )

    def kill_worker(self, worker: int | str, sig: int = signal.SIGKILL) -> WorkerHandle:
        """Send sig (default SIGKILL: kill -9) to a worker's process group and reap it; it leaves the cluster."""
        handle = self._take_worker(worker)
        handle.process.send_signal(sig)
        handle.process.wait(self.config.stop_timeout_s)
        if handle.process.is_running:  # a signal it survived (SIGTERM drains): make sure nothing is left over
            handle.process.stop(self.config.stop_timeout_s)
        return handle

    def stop_worker(self, worker: int | str, *, wait: bool = True) -> WorkerHandle:
        """SIGTERM a worker (it drains: refuses new requests, finishes running ones, deregisters, exits);
        wait=False returns at once (the process is reaped later, at the latest by stop())."""
        handle = self._take_worker(worker)
        if wait:
            handle.process.stop(self.config.stop_timeout_s)
            return handle
        handle.process.send_signal(signal.SIGTERM)
        with self._lock:
            self._draining.append(handle)
        return handle

    def _take_worker(self, worker: int | str) -> WorkerHandle:
        with self._lock:
            self._draining = [w for w in self._draining if w.process.is_running]
            if isinstance(worker, int):
                handle = self._workers[worker]
            else:
                matches = [w for w in self._workers if w.worker_id == worker]
                if not matches:
                    raise KeyError(
                        f"no managed worker {worker!r}; running: {[w.worker_id for w in self._workers]}"
                    )
                handle = matches[0]
            self._workers.remove(handle)
            return handle

    def live_worker_ids(self) -> list[str]:
        """The worker ids registered in Redis now (what the API replicas route to)."""
        import redis

        from cluster.membership import RedisWorkerDirectory

        client = redis.Redis.from_url(self.config.redis_url)
        try:
            return [r.worker_id for r in RedisWorkerDirectory(client, self.worker_key_prefix).list_live()]
        finally:
            client.close()

    def wait_live_workers(self, predicate: Any, timeout_s: float = 60.0) -> list[str]:
        """Poll live_worker_ids until predicate(ids) holds; TimeoutError otherwise."""
        deadline = time.monotonic() + timeout_s
        while True:
            ids = self.live_worker_ids()
            if predicate(ids):
                return ids
            if time.monotonic() > deadline:
                raise TimeoutError(f"live workers {ids} never satisfied the condition in {timeout_s:g} s")
            time.sleep(0.1)

    # ---- API replicas ------------------------------------------------------------------------------------

    def kill_api(self, index: int, sig: int = signal.SIGKILL) -> ChildProcess:
        """Send sig (default SIGKILL: kill -9) to API replica `index` and reap it; its URL answers nothing until
        restart_api(index)."""
        api = self.apis[index]
        api.send_signal(sig)
        api.wait(self.config.stop_timeout_s)
        if api.is_running:
            api.stop(self.config.stop_timeout_s)
        return api

    def restart_api(self, index: int) -> ChildProcess:
        """Start API replica `index` again on its port under its api_instance_id (so it writes what its previous run
        spooled and closes the rows it left open before it serves); returns once it is healthy."""
        old = self.apis[index]
        port = int((old.url or "").rsplit(":", 1)[1])
        api = self._spawn_api(index, port)
        self.apis[index] = api
        health_url = f"{api.url}/v1/health"
        wait_until(api, lambda: http_ok(health_url), self.config.start_timeout_s, "healthy")
        return api

    # ---- the jobs process (Celery worker + beat) ------------------------------------------------------------

    def kill_jobs(self, sig: int = signal.SIGKILL) -> ChildProcess:
        """Send sig (default SIGKILL: kill -9) to the jobs process and reap it; the tasks it had taken stay
        unacknowledged in Redis and are delivered again after jobs_celery_visibility_timeout_s."""
        jobs = self.jobs
        if jobs is None:
            raise RuntimeError("this cluster runs no jobs process (is_jobs_enabled=False)")
        jobs.send_signal(sig)
        jobs.wait(self.config.stop_timeout_s)
        if jobs.is_running:
            jobs.stop(self.config.stop_timeout_s)
        return jobs

    def restart_jobs(self) -> ChildProcess:
        """Start the jobs process again (after kill_jobs), logging to a new file; returns once it is ready."""
        jobs = self._spawn_jobs(f"jobs-{len(list(self._log_path('jobs').parent.glob('jobs*.log')))}")
        self.jobs = jobs
        wait_until(jobs, lambda: log_contains(jobs, " ready."), self.config.start_timeout_s, "ready")
        return jobs

    # ---- internals ---------------------------------------------------------------------------------------

    def _spawn_processes(self) -> None:
        for _ in range(self.config.num_workers):
            self.start_worker(wait=False)
        for name in self.config.catalog_models:
            for _ in range(self.config.num_catalog_workers):
                self.start_worker(base_model=name, wait=False)
        for index in range(self.config.num_api):
            self.apis.append(self._spawn_api(index))
        if self.config.is_jobs_enabled:
            self.jobs = self._spawn_jobs()

    def _spawn_api(self, index: int, port: int | None = None) -> ChildProcess:
        base = self.config.api_base_port
        port = port or (base + index if base is not None else free_port(self.config.host))
        url = f"http://{self.config.host}:{port}"
        env = {
            **self.child_env(),
            "LORAHOST_DATA_DIR": str(self.data_dir / f"api-{index}"),
            "LORAHOST_API_INSTANCE_ID": f"dev-api-{index}",
        }
        command = api_command(self.config.host, port)
        return spawn(f"api-{index}", command, env, self._log_path(f"api-{index}"), url=url)

    def _spawn_jobs(self, log_name: str = "jobs") -> ChildProcess:
        jobs_dir = self.data_dir / "jobs"
        jobs_dir.mkdir(parents=True, exist_ok=True)
        command = jobs_command(self.celery_queue, jobs_dir / "celerybeat-schedule")
        env = {**self.child_env(), **self.config.jobs_env, "LORAHOST_DATA_DIR": str(jobs_dir)}
        return spawn("jobs", command, env, self._log_path(log_name), cwd=jobs_dir)

    def _wait_healthy(self) -> None:
        timeout_s = self.config.start_timeout_s
        for api in self.apis:
            health_url = f"{api.url}/v1/health"
            wait_until(api, lambda url=health_url: http_ok(url), timeout_s, "healthy")  # type: ignore[misc]
        for worker in self.workers:
            self.wait_worker_ready(worker)
        jobs = self.jobs
        if jobs is not None:
            wait_until(jobs, lambda: log_contains(jobs, " ready."), timeout_s, "ready")

    def child_env(self) -> dict[str, str]:
        """The environment of every child: the parent's, config.env, then what this cluster owns."""
        owned = {
            "LORAHOST_DATABASE_URL": self.database_url or "",
            "LORAHOST_REDIS_URL": self.config.redis_url,
            "LORAHOST_BLOB_STORE": f"s3://{self.config.bucket}/{self.run_id}",
            "LORAHOST_S3_ENDPOINT_URL": self.services.s3_endpoint or "",
            "LORAHOST_IS_INLINE_JOBS": "false",
            "LORAHOST_CELERY_KEY_PREFIX": self.key_prefix,
            "LORAHOST_CELERY_QUEUE": self.celery_queue,
            "LORAHOST_WORKER_KEY_PREFIX": self.worker_key_prefix,
            "LORAHOST_INTERNAL_TOKEN": self.internal_token,
            "LORAHOST_ADMIN_KEY": self.admin_key,
            "LORAHOST_BASE_MODEL_PATH": str(self.services.base_model),
            "LORAHOST_BASE_MODEL_NAME": self.config.base_model_name,
        }
        return child_env(self.config.env, owned, is_moto=self.services.s3 is not None)

    def _log_path(self, name: str) -> Path:
        return self.data_dir / "logs" / f"{name}.log"
