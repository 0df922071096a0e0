"""The local process scaler of `lorahost dev-cluster --autoscale`: acts on `GET /v1/admin/scaling`.

The decision of how many workers a base model needs is the platform's (scheduler/, served by the API as
`{"base_model", "desired_workers", "live_workers", "demand_tokens_per_s", "reason"}`); this module only
turns it into process actions, as KEDA does in production:
- `plan_scaling` (pure, scheduler/scaling/scale_plan.py; the cluster twin runs it too): given the desired count and the workers this scaler manages (oldest first), how
  many to start and which to stop (the newest first: the older ones hold warm adapters).
- `ProcessScaler.step`: one poll (`fetch`) and one plan applied to a `WorkerPool` (DevCluster implements
  it: start a worker process without waiting for it, SIGTERM one so it drains). No answer (an API that
  does not serve the endpoint yet answers 404, an API that is down) keeps the current count.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import httpx

from scheduler.scaling.scale_plan import DEFAULT_INTERVAL_S, ScalePlan, plan_scaling

log = logging.getLogger("lorahost.scaler")
__all__ = [
    "DEFAULT_INTERVAL_S",
    "ProcessScaler",
    "ScalePlan",
    "ScalingTarget",
    "fetch_scaling",
    "parse_target",
    "plan_scaling",
]

_last_warning: list[str] = [""]  # the previous poll's warning: a repeated one is logged at debug level


def _warn(message: str) -> None:
    """Log a scaler warning once in a row (a 404 every poll would flood the log)."""
    level = logging.DEBUG if message == _last_warning[0] else logging.WARNING
    _last_warning[0] = message
    log.log(level, "scaler: %s; keeping the current workers", message)


@dataclass(frozen=True)
class ScalingTarget:
    """One answer of `GET /v1/admin/scaling?base_model=NAME`."""

    base_model: str
    desired_workers: int
    live_workers: int = 0
    demand_tokens_per_s: float = 0.0
    reason: str = ""


class WorkerPool(Protocol):
    """The worker processes a scaler manages."""

    def worker_ids(self) -> list[str]:
        """Managed workers that are running or starting (not the ones draining), oldest first."""
        ...

    def start_worker(self, *, wait: bool = True) -> object:
        """Start one worker process (wait=False: return once it is spawned)."""
        ...

    def stop_worker(self, worker: int | str, *, wait: bool = True) -> object:
        """SIGTERM one worker (it drains its running requests, then exits)."""
        ...


class ModelWorkerProcesses(Protocol):
    """Worker processes of several base models (lorahost/dev_cluster.py's DevCluster)."""

    def model_worker_ids(self, base_model: str) -> list[str]:
        """The running or starting workers of `base_model`, oldest first."""
        ...

    def start_worker(self, *, base_model: str | None = None, wait: bool = True) -> object:
        """Start one worker process of `base_model`."""
        ...

    def stop_worker(self, worker: int | str, *, wait: bool = True) -> object:
        """SIGTERM one worker."""
        ...


@dataclass(frozen=True)
class ModelWorkers:
    """The workers of one base model, as the `WorkerPool` of that model's scaler (each model scales from zero
    on its own)."""

    processes: ModelWorkerProcesses
    base_model: str

    def worker_ids(self) -> list[str]:
        """This model's managed workers, oldest first."""
        return self.processes.model_worker_ids(self.base_model)

    def start_worker(self, *, wait: bool = True) -> object:
        """Start one worker of this model."""
        return self.processes.start_worker(base_model=self.base_model, wait=wait)

    def stop_worker(self, worker: int | str, *, wait: bool = True) -> object:
        """SIGTERM one worker (of this model: the scaler only names its own)."""
        return self.processes.stop_worker(worker, wait=wait)


def parse_target(body: object) -> ScalingTarget:
    """A ScalingTarget from the endpoint's JSON; ValueError when a field is missing or of the wrong type."""
    if not isinstance(body, dict):
        raise ValueError(f"expected a JSON object, got {type(body).__name__}")  # noqa: TRY004 - bad input, one type
    try:
        return ScalingTarget(
            base_model=str(body["base_model"]),
            desired_workers=int(body["desired_workers"]),
            live_workers=int(body.get("live_workers", 0)),
            demand_tokens_per_s=float(body.get("demand_tokens_per_s", 0.0)),
            reason=str(body.get("reason", "")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"bad scaling answer {body!r}: {exc!r}") from exc


def fetch_scaling(
    api_url: str,
    admin_key: str,
    base_model: str,
    *,
    client: httpx.Client | None = None,
    timeout_s: float = 5.0,
) -> ScalingTarget | None:
    """`GET {api_url}/v1/admin/scaling?base_model=...` with the admin key; None when there is no usable answer
    (404: the API does not serve the endpoint; an error status; the API unreachable), logged."""
    http = client or httpx.Client(timeout=timeout_s)
    try:
        response = http.get(
            f"{api_url.rstrip('/')}/v1/admin/scaling",
            params={"base_model": base_model},
            headers={"Authorization": f"Bearer {admin_key}"},
        )
    except httpx.HTTPError as exc:
        _warn(f"{api_url} unreachable ({type(exc).__name__})")
        return None
    finally:
        if client is None:
            http.close()
    if response.status_code != 200:
        _warn(f"GET /v1/admin/scaling answered {response.status_code} ({response.text[:200]})")
        return None
    try:
        target = parse_target(response.json())
    except ValueError as exc:
        _warn(str(exc))
        return None
    _last_warning[0] = ""
    return target


class ProcessScaler:
    """Polls a scaling target and applies it to a worker pool, every interval_s in a thread (or by `step`)."""

    def __init__(
        self,
        fetch: Callable[[], ScalingTarget | None],
        pool: WorkerPool,
        *,
        max_workers: int,
        interval_s: float = DEFAULT_INTERVAL_S,
    ) -> None:
        self.fetch = fetch
        self.pool = pool
        self.max_workers = max_workers
        self.interval_s = interval_s
        self.last_target: ScalingTarget | None = None
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def step(self) -> ScalePlan:
        """One poll; applies and returns the plan (a no-op plan when the target is unavailable)."""
        target = self.fetch()
        if target is None:
            return ScalePlan()
        self.last_target = target
        plan = plan_scaling(target.desired_workers, self.pool.worker_ids(), self.max_workers)
        if not plan.is_noop:
            log.info(
                "scaler: %s wants %d worker(s) (%s): starting %d, stopping %s",
                target.base_model,
                target.desired_workers,
                target.reason or "no reason given",
                plan.num_to_start,
                list(plan.stop_ids) or "none",
            )
        for worker_id in plan.stop_ids:
            self.pool.stop_worker(worker_id, wait=False)
        for _ in range(plan.num_to_start):
            self.pool.start_worker(wait=False)
        return plan

    def start(self) -> ProcessScaler:
        """Poll in a daemon thread until stop()."""
        self._thread = threading.Thread(target=self._run, name="lorahost-scaler", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop polling (a step in progress finishes first)."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            try:
                self.step()
            except Exception:  # a failed start/stop must not end the scaler; the next poll retries
                log.exception("scaler step failed")
