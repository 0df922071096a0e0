"""Holding requests through a cold start: no ready worker for the base model yet (the worker is still
loading its model, none is registered, or the cluster is scaling up from zero).

A request whose base model has no ready worker waits, re-reading the worker directory every
settings.api.cold_start_poll_interval_s for its first second of waiting, then less often (a quarter of the time it
has waited, up to MAX_POLL_INTERVAL_S: `poll_interval_s`; thousands of requests held through a long cold start
must not each wake ten times a second), until one is ready or settings.api.cold_start_timeout_s has passed since it
began waiting; then it runs, or is refused with 503 + Retry-After (`ColdStartTimeout`). A worker that refuses
the request as unavailable (draining, overloaded, gone) puts it back to waiting within the same deadline.
A client that disconnects while waiting ends the wait with `ClientDisconnected` (metered `aborted`, 0 tokens).
A model whose worker cannot start (cluster/model_refusals.py: the embedded model pool's memory budget) ends the
wait at once with `ModelCannotStart` when it never will, else its reason ends the timeout's message.
Requests that had to wait are observed in the `lorahost_cold_start_wait_seconds` histogram; the ones waiting
now are the `lorahost_cold_start_waiting_requests` gauge (the demand signal a scale-from-zero acts on).
Which workers count as ready is the scheduler's decision (`scheduler.routing.router.ready_workers`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import anyio
from starlette.types import Receive

from api.disconnect import run_until_disconnect
from api.metrics import ApiMetrics
from api.worker_client import num_ready_workers
from cluster.membership import WorkerRecord
from cluster.model_refusals import ModelRefusal
from settings import Settings

ListRecords = Callable[[], Awaitable[list[WorkerRecord]]]
FULL_RATE_S = 1.0  # a wait polls at the configured interval for this long
MAX_POLL_INTERVAL_S = 1.0  # then at most this long between polls (or the configured interval, if longer)
CurrentRefusal = Callable[[], ModelRefusal | None]


def poll_interval_s(configured_s: float, waited_s: float) -> float:
    """How long a request that has waited `waited_s` sleeps before it polls again: `configured_s` for the first
    FULL_RATE_S, then a quarter of the time waited, between `configured_s` and max(configured_s,
    MAX_POLL_INTERVAL_S). A worker that becomes ready is seen within that long (a second at most, by default)."""
    if waited_s < FULL_RATE_S:
        return configured_s
    return max(configured_s, min(MAX_POLL_INTERVAL_S, waited_s / 4))


def _no_refusal() -> ModelRefusal | None:
    return None


class ColdStartTimeout(Exception):
    """No worker of the base model became ready within cold_start_timeout_s."""


class ModelCannotStart(Exception):
    """The base model's worker will never start as the server is configured (the message says what to change)."""


class ColdStartWait:
    """One request's wait for a ready worker of its base model (bounded; cancelled by a disconnect)."""

    def __init__(
        self, settings: Settings, base_model: str, receive: Receive, metrics: ApiMetrics | None = None
    ) -> None:
        self.base_model = base_model
        self.timeout_s = settings.api.cold_start_timeout_s
        self.poll_interval_s = settings.api.cold_start_poll_interval_s
        self._receive = receive
        self._metrics = metrics
        self._started_s: float | None = None  # set when the request first has to wait

    @property
    def has_waited(self) -> bool:
        """True once the request found no ready worker."""
        return self._started_s is not None

    def waited_s(self) -> float:
        """Seconds spent waiting so far (0 if it never waited)."""
        return 0.0 if self._started_s is None else time.monotonic() - self._started_s

    async def ready_records(
        self, list_records: ListRecords, refusal: CurrentRefusal = _no_refusal
    ) -> list[WorkerRecord]:
        """The live records, once at least one ready worker serves the base model (waits until then);
        ModelCannotStart when `refusal()` says its worker never will."""
        records = await list_records()
        while num_ready_workers(self.base_model, records) == 0:
            why = refusal()
            if why is not None and why.is_final:
                self.observe()
                raise ModelCannotStart(why.message)
            await self.pause(why.message if why is not None else None)
            records = await list_records()
        return records

    async def pause(self, reason: str | None = None) -> None:
        """Wait one poll interval (the clock starts at the first pause); ColdStartTimeout past the deadline
        (its message ends with `reason`, why the last attempt failed), ClientDisconnected if the client leaves
        meanwhile."""
        if self._started_s is None:
            self._started_s = time.monotonic()
            if self._metrics is not None:
                self._metrics.cold_start_waiting.labels(base_model=self.base_model).inc()
        remaining = self.timeout_s - self.waited_s()
        if remaining <= 0:
            self.observe()
            why = f" (last attempt: {reason})" if reason else " (no live worker serves it)"
            raise ColdStartTimeout(
                f"no worker serving base model {self.base_model!r} became ready within {self.timeout_s:g} s{why}"
            )
        try:
            await run_until_disconnect(
                self._receive,
                lambda: anyio.sleep(min(poll_interval_s(self.poll_interval_s, self.waited_s()), remaining)),
            )
        except BaseException:
            self.observe()
            raise

    def observe(self) -> None:
        """End the wait: record it in the histogram and leave the waiting gauge (once; only if it waited)."""
        if self._started_s is not None and self._metrics is not None:
            self._metrics.cold_start_wait_s.labels(base_model=self.base_model).observe(self.waited_s())
            self._metrics.cold_start_waiting.labels(base_model=self.base_model).dec()
            self._metrics = None
