"""The usage writer: three daemon threads that write usage rows off the request path (api/metering.py states the
crash-safe protocol they implement). Writes run on DB sessions or connections of their own, so neither a request's
own session nor the event loop is involved.

The opener inserts each opened row at once (with the others opened meanwhile, in one statement): a request's
first token waits for that insert (api/inference/serve.py), so it has a thread and a connection of its own and
never waits behind the other writes. The finisher gives ended requests their final values (with the others ended
meanwhile, in one statement or transaction): a stream's usage chunk and [DONE] wait for it, and a burst of ends
costs a few writes, not one each on the shared thread pool. On PostgreSQL each of the two keeps an autocommit
connection: one round trip a batch (registry/usage_autocommit.py). The checkpointer runs the periodic writes: every
`interval_s` the spool's replay and the streams' checkpoints (one UPDATE for all), every `renewal_interval_s`
the leases' and the slots' renewals.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from api.errors import DATABASE_ERRORS, is_database_unavailable
from api.request_meter import ADMISSION_FIELDS, RequestMeter
from api.usage_spool import UsageSpool
from registry.models import utcnow
from registry.usage import DuplicateUsageError, finish_usage, record_usage, renew_usage_leases
from registry.usage_autocommit import AutocommitUsageConnection
from registry.usage_batches import checkpoint_usage, finish_open_usage, open_usage

log = logging.getLogger(__name__)
# Renews the concurrent-request slots of (tenant id, request id) pairs (api/ratelimit.py RateLimiter.renew_slots).
SlotRenewer = Callable[[list[tuple[str, str]]], object]


class UsageWriter:
    """The opener, finisher and checkpointer threads (module docstring) of one API process: rows opened are inserted at
    once (batched), final values written at once (batched); every `interval_s` watched streams are checkpointed (one
    UPDATE for all that changed); every `renewal_interval_s` (default `interval_s`) the lease of every row this
    process holds open is renewed (one UPDATE for all, owner `api_instance_id`; None: no renewals) and so are the
    concurrent-request slots of those that hold one (one `renew_slots` call for all; None: no slot renewals).
    `flush_opens`, `checkpoint`, `flush_finals`, `renew_leases`, `renew_slots` and `run_round` are the threads'
    jobs, callable directly (tests)."""

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
        *,
        renewal_interval_s: float | None = None,
        api_instance_id: str | None = None,
        renew_slots: SlotRenewer | None = None,
        spool: UsageSpool | None = None,
    ) -> None:
        self.session_factory = session_factory
        # PostgreSQL: the opener's and the finisher's writes each on an autocommit connection of its own (one round
        # trip a batch: registry/usage_autocommit.py); the engine is the sessionmaker's (tests pass stand-ins)
        bind = getattr(session_factory, "kw", {}).get("bind")
        engine = bind if isinstance(bind, Engine) and AutocommitUsageConnection.is_supported(bind) else None
        self._open_connection = AutocommitUsageConnection(engine) if engine is not None else None
        self._final_connection = AutocommitUsageConnection(engine) if engine is not None else None
        self.spool = spool
        self.interval_s = interval_s
        self.renewal_interval_s = max(interval_s, renewal_interval_s or interval_s)
        self.api_instance_id = api_instance_id
        self._renew_slots = renew_slots
        self._clock = clock
        self._lock = threading.Lock()
        self._has_opens = threading.Event()
        self._has_finals = threading.Event()
        self._pending: list[tuple[dict[str, Any], Future[None]]] = []
        self._finals: list[tuple[dict[str, Any], bool, Future[None]]] = []  # values, is_opened, done
        self._watched: dict[str, tuple[RequestMeter, tuple[int, int, str | None] | None]] = {}
        self._held: set[str] = (
            set()
        )  # request ids opened and not yet being finished: their leases are renewed
        self._slots: dict[
            str, str
        ] = {}  # request id -> tenant id of the held ones holding a concurrency slot
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()

    def open(
        self, values: dict[str, Any], watch: RequestMeter | None = None, *, holds_slot: bool = False
    ) -> Future[None]:
        """Queue an in_progress row for insertion (done when the future is) and hold its lease until `unwatch`;
        `watch` it for checkpoints; `holds_slot`: renew its concurrent-request slot until `unwatch` as well."""
        future = _uncancellable_future()
        with self._lock:
            self._pending.append((values, future))
            self._held.add(values["request_id"])
            if holds_slot:
                self._slots[values["request_id"]] = values["tenant_id"]
            if watch is not None:
                self._watched[watch.request_id] = (watch, None)
            self._ensure_threads()
        self._has_opens.set()
        return future

    def finish(self, values: dict[str, Any], is_opened: bool) -> Future[None]:
        """Queue a request's final values (every UsageRecord column; `is_opened`: its in_progress row was written,
        so they update it, else they are inserted); done once written or spooled, failed if neither was possible
        (logged). Call `unwatch` first."""
        future = _uncancellable_future()
        with self._lock:
            self._finals.append((values, is_opened, future))
            self._ensure_threads()
        self._has_finals.set()
        return future

    def unwatch(self, meter: RequestMeter) -> None:
        """Stop checkpointing a request and renewing its lease and slot (it is being given its final values)."""
        with self._lock:
            self._watched.pop(meter.request_id, None)
            self._held.discard(meter.request_id)
            self._slots.pop(meter.request_id, None)

    def num_watched(self) -> int:
        """How many streams are being checkpointed."""
        with self._lock:
            return len(self._watched)

    def flush_opens(self) -> None:
        """Insert every queued row, in one transaction (one by one if that fails, so one bad row fails alone)."""
        with self._lock:
            pending, self._pending = self._pending, []
        if not pending:
            return
        try:
            self._insert([values for values, _ in pending])
            outcomes: list[BaseException | None] = [None] * len(pending)
        except Exception:  # noqa: BLE001 - retried row by row below
            outcomes = [self._insert_one(values) for values, _ in pending]
        for (_, future), error in zip(pending, outcomes, strict=True):
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

    def flush_finals(self) -> None:
        """Write every queued final: the open rows' updates in one transaction, then one by one what that did not
        write (a row swept meanwhile or never opened, or every row if the transaction failed), so one bad row
        fails alone."""
        with self._lock:
            finals, self._finals = self._finals, []
        if not finals:
            return
        opened = [_finished(values) for values, is_opened, _ in finals if is_opened]
        left: set[str] | None = None  # None: every row is left (the batch failed)
        if opened:
            try:
                left = self._finish_opened(opened)
            except Exception:  # noqa: BLE001 - written row by row below (spooled there if the DB is down)
                left = None
        for values, is_opened, future in finals:
            if is_opened and left is not None and values["request_id"] not in left:
                future.set_result(None)
                continue
            error = self._finish_one(values, is_opened)
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

    def checkpoint(self) -> int:
        """Write the delivered tokens of every watched, opened stream that changed since its last checkpoint;
        returns how many rows were written."""
        with self._lock:
            due = [
                (m, last) for m, last in self._watched.values() if m.is_open() and m.checkpoint_key() != last
            ]
        if not due:
            return 0
        checkpointed_at = (
            utcnow()
        )  # before any count is read: every token counted by then is in the checkpoint
        values = [meter.checkpoint_values(checkpointed_at) for meter, _ in due]
        try:
            with self.session_factory() as session:
                checkpoint_usage(session, values)
        except DATABASE_ERRORS as exc:
            if self.spool is None or not is_database_unavailable(exc):
                raise
            log.warning(
                "usage writer: %d checkpoints spooled, the database did not take them: %s",
                len(values),
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
            )
            for checkpoint in values:
                self.spool.add("checkpoint", checkpoint)
        with self._lock:
            for (meter, _), written in zip(due, values, strict=True):
                if meter.request_id in self._watched:
                    self._watched[meter.request_id] = (meter, written_key(written))
        return len(due)

    def renew_leases(self) -> int:
        """Renew the lease of every row this process holds open that shows no sign of life (a renewal or a
        checkpoint: registry.usage.renew_usage_leases) from the last half renewal interval, with one UPDATE (none
        while it holds none); returns how many rows it renewed. No row's latest sign is then ever older than about
        1.5 renewal intervals (the lease is at least two)."""
        with self._lock:
            is_holding = bool(self._held)
        if self.api_instance_id is None or not is_holding:
            return 0
        with self.session_factory() as session:
            return renew_usage_leases(session, self.api_instance_id, fresh_s=self.renewal_interval_s / 2)

    def renew_slots(self) -> int:
        """Renew the concurrent-request slot of every request this process holds open that holds one, with one
        `renew_slots` call (none while it holds none); returns how many slots it asked to renew."""
        with self._lock:
            slots = [(tenant_id, request_id) for request_id, tenant_id in self._slots.items()]
        if self._renew_slots is None or not slots:
            return 0
        self._renew_slots(slots)
        return len(slots)

    def run_round(self, *, is_renewal_due: bool) -> None:
        """One round of the checkpointer: the spool's replay (first: a checkpoint it holds is older than the one
        written next), the checkpoints, then, when due, the renewals; each job on its own, so a failed checkpoint
        does not stop the lease renewals."""
        jobs: list[Callable[[], object]] = [self.replay_spool, self.checkpoint]
        if is_renewal_due:
            jobs += [self.renew_leases, self.renew_slots]
        for job in jobs:
            _run_logged(job)

    def close(self) -> None:
        """Stop the threads, then write the rows still queued (a later `open` or `finish` starts new threads)."""
        with self._lock:
            threads, stop, self._threads, self._stop = self._threads, self._stop, [], threading.Event()
        stop.set()
        self._has_opens.set()
        self._has_finals.set()
        for thread in threads:
            thread.join(timeout=10)
        self.flush_opens()
        self.flush_finals()
        for connection in (self._open_connection, self._final_connection):
            if connection is not None:
                connection.close()

    def _finish_opened(self, rows: list[dict[str, Any]]) -> set[str]:
        """Write the finals of opened rows in one statement or transaction; the request ids that had no open row."""
        left = self._final_connection.finish(rows) if self._final_connection is not None else None
        if left is None:
            with self.session_factory() as session:
                left = finish_open_usage(session, rows)
        return set(left)

    def _insert(self, rows: list[dict[str, Any]]) -> None:
        if self._open_connection is not None and AutocommitUsageConnection.is_insertable(rows):
            self._open_connection.insert(rows)
            return
        with self.session_factory() as session:
            open_usage(session, rows)

    def _insert_one(self, values: dict[str, Any]) -> BaseException | None:
        try:
            self._insert([values])
            return None
        except Exception as exc:
            if self.spool is not None and is_database_unavailable(exc):
                self.spool.add("open", values)  # durable on local disk until the database answers
                return None
            log.exception("could not open the usage row of request %s", values["request_id"])
            return exc

    def _finish_one(self, values: dict[str, Any], is_opened: bool) -> BaseException | None:
        """One final on its own: the open or swept row updated, else inserted; spooled while the database is
        unavailable."""
        try:
            with self.session_factory() as session:
                if not (is_opened and finish_usage(session, _finished(values))):
                    record_usage(session, **values)
            return None
        except DuplicateUsageError:
            log.error("BUG: request %s metered twice; the second row was not written", values["request_id"])
            return None
        except Exception as exc:
            if self.spool is not None and is_database_unavailable(exc):
                self.spool.add("final", values)  # written by the next replay, once the database answers
                return None
            log.exception("could not write the usage row of request %s", values["request_id"])
            return exc

    def replay_spool(self) -> int:
        """Write the spooled usage writes to the database (none when none wait); returns how many requests."""
        if self.spool is None or not self.spool.has_pending():
            return 0
        return self.spool.replay(self.session_factory)

    def _ensure_threads(self) -> None:
        if not self._threads:
            self._threads = [
                threading.Thread(target=run, args=(self._stop,), name=name, daemon=True)
                for run, name in (
                    (self._run_opener, "lorahost-usage-opener"),
                    (self._run_finisher, "lorahost-usage-finisher"),
                    (self._run_checkpointer, "lorahost-usage-checkpointer"),
                )
            ]
            for thread in self._threads:
                thread.start()

    def _run_opener(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self._has_opens.wait()
            self._has_opens.clear()
            _run_logged(self.flush_opens)

    def _run_finisher(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self._has_finals.wait()
            self._has_finals.clear()
            _run_logged(self.flush_finals)

    def _run_checkpointer(self, stop: threading.Event) -> None:
        next_round_s = self._clock() + self.interval_s
        next_renewal_s = self._clock() + self.renewal_interval_s
        while not stop.wait(timeout=max(0.0, next_round_s - self._clock())):
            now = self._clock()
            if now < next_round_s:
                continue
            is_renewal_due = now >= next_renewal_s
            self.run_round(is_renewal_due=is_renewal_due)
            next_round_s = self._clock() + self.interval_s
            if is_renewal_due:
                next_renewal_s = now + self.renewal_interval_s


def _run_logged(job: Callable[[], object]) -> None:
    """Run one of the writer's jobs; a failure is logged and retried at the job's next turn."""
    try:
        job()
    except Exception as exc:
        if is_database_unavailable(exc):
            log.warning("usage writer: the database is unavailable; retrying at the next round")
        else:
            log.exception("usage writer: a write failed; retrying at the next round")


def _uncancellable_future() -> Future[None]:
    """A future for a queued write that a waiter's cancellation cannot cancel (`asyncio.wrap_future` cancels a
    pending source): the write happens anyway, and the thread must be able to resolve it and the others of its
    batch (`set_result` on a cancelled future raises, which would leave them unresolved)."""
    future: Future[None] = Future()
    future.set_running_or_notify_cancel()
    return future


def _finished(values: dict[str, Any]) -> dict[str, Any]:
    """What a final writes over its open row: every column but the admission fields (written at open)."""
    return {k: v for k, v in values.items() if k not in ADMISSION_FIELDS}


def written_key(values: dict[str, Any]) -> tuple[int, int, str | None]:
    """The checkpoint key of what was just written for a meter (its written values, not the live meter, which
    may have moved on meanwhile)."""
    return values["prompt_tokens"], values["completion_tokens"], values["worker_id"]
