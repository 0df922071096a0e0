"""The usage sweep: close as `interrupted` the open usage rows of workers that left the worker directory,
and those whose owner (an API process) stopped renewing their lease; then sum the days that settled into the
daily usage rollup (registry/usage_rollup.py).

The decisions are registry.usage.orphaned_request_ids and expired_lease_request_ids (pure); this module only
wires them to a session and a directory. Cluster mode runs `sweep_usage` from Celery beat
(jobs/celery_app.py); with inline jobs the API runs it on a `PeriodicJob` timer (api/main.py), every
settings.jobs.usage_sweep_interval_s. Running it in several places at once is harmless: closing a row is one
conditional UPDATE, and rolling a day one transaction under the rollup lock that re-checks the day.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import date

from sqlalchemy.orm import Session, sessionmaker

from cluster.membership import WorkerDirectory
from registry.usage import close_expired_usage, close_orphaned_usage
from registry.usage_rollup import roll_up_usage
from settings import Settings

log = logging.getLogger(__name__)


def sweep_grace_s(settings: Settings) -> float:
    """How long an open row of a vanished worker is left alone: two checkpoints and one heartbeat TTL, so a
    worker that only missed a heartbeat, or a stream about to checkpoint, is not closed early."""
    return 2 * settings.metering.checkpoint_interval_s + settings.worker.resolved_heartbeat_ttl_s()


def sweep_orphaned_usage(
    session_factory: sessionmaker[Session], directory: WorkerDirectory, grace_s: float
) -> list[str]:
    """Close (as interrupted) the open rows whose worker is not live; returns their request ids."""
    live_worker_ids = {record.worker_id for record in directory.list_live()}
    with session_factory() as session:
        closed = close_orphaned_usage(session, live_worker_ids, grace_s)
    if closed:
        log.warning(
            "closed %d usage row(s) of dead workers as interrupted: %s", len(closed), ", ".join(closed)
        )
    return closed


def sweep_expired_usage(session_factory: sessionmaker[Session], lease_timeout_s: float) -> int:
    """Close (as interrupted) the open rows whose lease is older than lease_timeout_s; returns how many."""
    with session_factory() as session:
        num_closed = close_expired_usage(session, lease_timeout_s)
    if num_closed:
        log.warning(
            "closed %d usage row(s) as interrupted: their API process has not renewed their lease for %.0f s",
            num_closed,
            lease_timeout_s,
        )
    return num_closed


def roll_up_settled_usage(session_factory: sessionmaker[Session], settle_s: float) -> list[date]:
    """Sum the settled days that are not rolled up yet into the daily rollup (a month of days per run at most);
    returns the days rolled."""
    with session_factory() as session:
        days = roll_up_usage(session, settle_s)
    if days:
        log.info("rolled up the usage of %d day(s): %s .. %s", len(days), days[0], days[-1])
    return days


def sweep_usage(
    session_factory: sessionmaker[Session], directory: WorkerDirectory | None, settings: Settings
) -> int:
    """One run of the periodic usage sweep: the rows of dead workers (when a worker directory is known), then
    the rows of expired leases, then the daily rollup of the days that settled; returns how many rows it
    closed."""
    num_closed = 0
    if directory is not None:
        num_closed += len(sweep_orphaned_usage(session_factory, directory, sweep_grace_s(settings)))
    num_closed += sweep_expired_usage(session_factory, settings.metering.lease_timeout_s)
    roll_up_settled_usage(session_factory, settings.metering.rollup_settle_s)
    return num_closed


class PeriodicJob:
    """Runs `job` every `interval_s` seconds on a daemon thread until stopped (inline jobs' timer);
    `is_run_at_start`: also once as soon as it starts."""

    def __init__(
        self, name: str, interval_s: float, job: Callable[[], object], *, is_run_at_start: bool = False
    ) -> None:
        self.name = name
        self.interval_s = interval_s
        self.job = job
        self.is_run_at_start = is_run_at_start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lorahost-{name}", daemon=True)

    def start(self) -> PeriodicJob:
        """Start the timer (the first run is one interval from now, or now with is_run_at_start)."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the timer (a run in progress finishes first)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _run(self) -> None:
        if self.is_run_at_start:
            self._run_once()
        while not self._stop.wait(self.interval_s):
            self._run_once()

    def _run_once(self) -> None:
        try:
            self.job()
        except Exception:
            log.exception("periodic job %s failed", self.name)
