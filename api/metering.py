"""Metering: exactly one UsageRecord (and one metrics observation) per authenticated inference request.

A `RequestMeter` follows one request: it is started right after authentication, learns the adapter and
prompt size as the request is prepared, counts the tokens actually handed to the client and measures
latency at the API (what the client sees): TTFT = request arrival -> first delivered token, TPOT = mean gap
between delivered tokens, E2E = arrival -> finish.

Crash-safe rows (a `kill -9` of the API must not lose delivered tokens):
- `UsageLedger.open(meter, ...)`, called once the request is admitted, hands its `in_progress` row (owner:
  this process's api_instance_id, zero tokens) to the ledger's writer thread, which inserts it at once,
  together with the other requests opened meanwhile, in one transaction. The insert runs while the request is
  routed and prefilled, so it costs the hot path nothing unless it is slower than the prefill:
  `wait_opened(meter)` is awaited before the first token is sent, so no token reaches a client before its
  request's row is durable (a crash before then bills nothing, and nothing was delivered).
- Streamed requests are checkpointed by the same thread every `usage_checkpoint_interval_s`: one UPDATE per
  open stream whose tokens changed, all in one transaction. A crash bills the last checkpoint: at most one
  interval (plus one write) behind what was delivered, never more than was delivered.
- Non-streamed requests are not checkpointed: their tokens reach the client only with the response, so a
  crash before it bills nothing (0 prompt and 0 completion tokens), which is what was delivered.
- Every open row, streamed or not, carries a lease (`lease_renewed_at`, set when the row is opened). The same
  thread renews the leases of all the rows this process holds open every `usage_checkpoint_interval_s`, with
  one UPDATE (registry.usage.renew_usage_leases; none while it holds no open row). The usage sweep closes a
  row whose lease is older than `usage_lease_timeout_s` (its owner is gone: killed and restarted under another
  api_instance_id, or scaled down). Lease renewals never touch `checkpointed_at`: that stays the moment the
  billed tokens were counted.
- The same round also renews the concurrent-request slots (a plan's max_concurrent_requests, api/ratelimit.py)
  of the open requests that hold one, with one call of the ledger's `renew_slots` for all (one Redis round
  trip). A slot not renewed for `usage_lease_timeout_s` stops counting, so a killed process's slots are free
  again within that lease, like its rows; the slot renewal runs even when the usage UPDATE fails.
- `UsageLedger.record(meter, status)` then gives the row its final values once (later calls are no-ops): an
  UPDATE of the open row, never a second row (an INSERT when the row was never opened: a request rejected
  before admission, or an open insert that failed).
- A restarted process closes what its predecessor left open (registry.usage.close_interrupted_usage), and
  a periodic sweep closes the rows of dead workers (close_orphaned_usage) and of expired leases
  (close_expired_usage), all as `interrupted`. A row closed while its API still served it (a late renewal)
  is given its true final values by `record` all the same.
The open row also carries the output-length prediction and its inputs (max_tokens, is_chat, has_stop;
ADMISSION_FIELDS, never updated after; nothing derived from the prompt's content), the training data of the
length predictor (registry/predictor_training.py); an `ok` request's true output length is handed to
`observe_output` (the predictor's history of that tenant on that adapter) as it is recorded.
Writes run on fresh DB sessions in threads, so the request's own session and the event loop are never
involved. Statuses:
  in_progress  the request is running; prompt tokens once prefilled + delivered tokens, as of the last
               checkpoint (streams) or zero (non-streamed)
  ok           the worker finished; prompt + delivered tokens
  error        the worker failed; prompt tokens once prefill happened (a token was delivered or the worker
               reported its prompt count) + delivered tokens
  aborted      the client went away (the worker request is aborted); prompt tokens once a token was
               delivered + the tokens delivered until then (streamed: sent; non-streamed: received for the
               response)
  rejected     refused before any work (bad request, unknown model, rate limit, no worker): zero tokens
  interrupted  the API process or the worker died first: the row as of its last checkpoint
`record` also gives back the request's concurrent-request slot (a plan's max_concurrent_requests,
api/ratelimit.py), so it is released exactly once however the request ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import anyio.to_thread
from sqlalchemy.orm import Session, sessionmaker

from api.metrics import ApiMetrics
from registry.models import OPEN_USAGE_STATUS, new_id, utcnow
from registry.usage import (
    DuplicateUsageError,
    checkpoint_usage,
    finish_usage,
    open_usage,
    record_usage,
    renew_usage_leases,
)

log = logging.getLogger(__name__)
MAX_ERROR_MESSAGE_CHARS = 1000
# Columns written with the open row that the final update leaves alone (RequestMeter.admission_values).
# (UsageRecord.prompt_features is no longer written: issue 19.)
ADMISSION_FIELDS = frozenset({"max_tokens", "is_chat", "has_stop"})
# Told each `ok` request's tenant id, adapter key (the adapter version id; None: the base model) and true
# output tokens, on the event loop (the learned length predictor's history of that tenant on that adapter:
# api/inference/learned_predictor.py).
OutputObserver = Callable[[str, str | None, int], None]
# Renews the concurrent-request slots of (tenant id, request id) pairs (api/ratelimit.py RateLimiter.renew_slots).
SlotRenewer = Callable[[list[tuple[str, str]]], object]


@dataclass
class RequestMeter:
    """What one request used and how fast it was served (filled in as the request proceeds)."""

    tenant_id: str
    model_name: str = ""
    request_id: str = field(default_factory=lambda: f"req-{new_id()}")
    adapter_id: str | None = None
    adapter_version_id: str | None = None
    worker_id: str | None = None
    num_prompt_tokens: int = 0
    predicted_output_tokens: int | None = None  # api/inference/predict.py; None: refused before the prediction
    # what the prediction saw (api/inference/predict.py), recorded for the predictor's training job
    max_tokens: int | None = None
    is_chat: bool | None = None
    has_stop: bool | None = None
    num_delivered_tokens: int = 0
    is_prefilled: bool = False
    started_at: datetime = field(default_factory=utcnow)
    started_s: float = field(default_factory=time.perf_counter)
    first_token_s: float | None = None
    last_token_s: float | None = None
    is_recorded: bool = False
    opened: Future[None] | None = None  # the in_progress row's insert (None: never opened)
    release_slot: Callable[[], None] | None = None  # gives back its concurrent-request slot (api/ratelimit.py)

    def on_delivered(self, num_tokens: int) -> None:
        """Count tokens handed to the client (timestamps the first and the latest delivery)."""
        if num_tokens <= 0:
            return
        now = time.perf_counter()
        if self.first_token_s is None:
            self.first_token_s = now
        self.last_token_s = now
        self.num_delivered_tokens += num_tokens
        self.is_prefilled = True

    def withdraw_undelivered(self) -> None:
        """Un-count tokens that were received but will never reach the client (a non-streamed response that
        is not sent); the request stays prefilled."""
        self.num_delivered_tokens = 0

    def latencies_ms(self, finished_s: float) -> tuple[float | None, float | None, float]:
        """(TTFT, mean TPOT, E2E) in ms; TTFT is None without a token, TPOT without a second one."""
        e2e = (finished_s - self.started_s) * 1000
        if self.first_token_s is None:
            return None, None, e2e
        ttft = (self.first_token_s - self.started_s) * 1000
        tpot = None
        if self.num_delivered_tokens > 1 and self.last_token_s is not None:
            tpot = (self.last_token_s - self.first_token_s) * 1000 / (self.num_delivered_tokens - 1)
        return ttft, tpot, e2e

    def billed_prompt_tokens(self, status: str) -> int:
        """Prompt tokens billed for a status (see the module docstring)."""
        if status == "ok" or (status in ("error", "aborted", OPEN_USAGE_STATUS) and self.is_prefilled):
            return self.num_prompt_tokens
        return 0

    def is_open(self) -> bool:
        """True when the in_progress row was written (and not yet given its final values)."""
        opened = self.opened
        return opened is not None and opened.done() and opened.exception() is None and not self.is_recorded

    def open_values(self, api_instance_id: str) -> dict[str, Any]:
        """The `in_progress` row written when the request starts (no tokens billed yet)."""
        return {
            "request_id": self.request_id,
            "tenant_id": self.tenant_id,
            "adapter_id": self.adapter_id,
            "adapter_version_id": self.adapter_version_id,
            "model_name": self.model_name or "unknown",
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "predicted_output_tokens": self.predicted_output_tokens,
            **self.admission_values(),
            "status": OPEN_USAGE_STATUS,
            "worker_id": self.worker_id,
            "api_instance_id": api_instance_id,
            "started_at": self.started_at,
            "lease_renewed_at": utcnow(),  # not started_at: a request held through a cold start is not overdue
        }

    def admission_values(self) -> dict[str, Any]:
        """The prediction's inputs (ADMISSION_FIELDS): written when the row opens, never changed after."""
        return {
            "max_tokens": self.max_tokens,
            "is_chat": self.is_chat,
            "has_stop": self.has_stop,
        }

    def checkpoint_key(self) -> tuple[int, int, str | None]:
        """What a checkpoint records that can change: (billed prompt tokens, delivered tokens, worker)."""
        return self.billed_prompt_tokens(OPEN_USAGE_STATUS), self.num_delivered_tokens, self.worker_id

    def checkpoint_values(self) -> dict[str, Any]:
        """The open row's columns as of now (registry.usage.CHECKPOINT_FIELDS)."""
        checkpointed_at = utcnow()  # before the counts are read: every token counted by then is in the checkpoint
        prompt, delivered, worker_id = self.checkpoint_key()
        ttft, tpot, e2e = self.latencies_ms(time.perf_counter())
        return {
            "request_id": self.request_id,
            "prompt_tokens": prompt,
            "completion_tokens": delivered,
            "ttft_ms": ttft,
            "tpot_ms": tpot,
            "e2e_ms": e2e,
            "worker_id": worker_id,
            "checkpointed_at": checkpointed_at,
        }

    def usage_values(self, status: str, error_message: str | None) -> dict[str, Any]:
        """The UsageRecord columns for this request ending with `status`."""
        ttft, tpot, e2e = self.latencies_ms(time.perf_counter())
        delivered = 0 if status == "rejected" else self.num_delivered_tokens
        return {
            "request_id": self.request_id,
            "tenant_id": self.tenant_id,
            "adapter_id": self.adapter_id,
            "adapter_version_id": self.adapter_version_id,
            "model_name": self.model_name or "unknown",
            "prompt_tokens": self.billed_prompt_tokens(status),
            "completion_tokens": delivered,
            "predicted_output_tokens": self.predicted_output_tokens,
            **self.admission_values(),
            "ttft_ms": ttft if status != "rejected" else None,
            "tpot_ms": tpot if status != "rejected" else None,
            "e2e_ms": e2e,
            "status": status,
            "worker_id": self.worker_id,
            "error_message": error_message[:MAX_ERROR_MESSAGE_CHARS] if error_message else None,
            "started_at": self.started_at,
            "finished_at": utcnow(),
        }


class UsageWriter:
    """A daemon thread that inserts opened rows at once (batched) and, every `interval_s`, checkpoints watched
    streams (one UPDATE per changed stream, all in one transaction) and renews the lease of every row this
    process holds open (one UPDATE for all, owner `api_instance_id`; None: no renewals) and the concurrent-request
    slots of those that hold one (one `renew_slots` call for all; None: no slot renewals). `flush_opens`,
    `checkpoint`, `renew_leases` and `renew_slots` are the thread's jobs, callable directly (tests)."""

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
        *,
        api_instance_id: str | None = None,
        renew_slots: SlotRenewer | None = None,
    ) -> None:
        self.session_factory = session_factory
        self.interval_s = interval_s
        self.api_instance_id = api_instance_id
        self._renew_slots = renew_slots
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._pending: list[tuple[dict[str, Any], Future[None]]] = []
        self._watched: dict[str, tuple[RequestMeter, tuple[int, int, str | None] | None]] = {}
        self._held: set[str] = set()  # request ids opened and not yet being finished: their leases are renewed
        self._slots: dict[str, str] = {}  # request id -> tenant id of the held ones holding a concurrency slot
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def open(
        self, values: dict[str, Any], watch: RequestMeter | None = None, *, holds_slot: bool = False
    ) -> Future[None]:
        """Queue an in_progress row for insertion (done when the future is) and hold its lease until `unwatch`;
        `watch` it for checkpoints; `holds_slot`: renew its concurrent-request slot until `unwatch` as well."""
        future: Future[None] = Future()
        with self._lock:
            self._pending.append((values, future))
            self._held.add(values["request_id"])
            if holds_slot:
                self._slots[values["request_id"]] = values["tenant_id"]
            if watch is not None:
                self._watched[watch.request_id] = (watch, None)
            self._ensure_thread()
        self._wake.set()
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

    def checkpoint(self) -> int:
        """Write the delivered tokens of every watched, opened stream that changed since its last checkpoint;
        returns how many rows were written."""
        with self._lock:
            due = [(m, last) for m, last in self._watched.values() if m.is_open() and m.checkpoint_key() != last]
        if not due:
            return 0
        values = [meter.checkpoint_values() for meter, _ in due]
        with self.session_factory() as session:
            checkpoint_usage(session, values)
        with self._lock:
            for meter, _ in due:
                if meter.request_id in self._watched:
                    self._watched[meter.request_id] = (meter, meter_key(values, meter))
        return len(due)

    def renew_leases(self) -> int:
        """Renew the lease of every row this process holds open, with one UPDATE (none while it holds none);
        returns how many rows it renewed."""
        with self._lock:
            is_holding = bool(self._held)
        if self.api_instance_id is None or not is_holding:
            return 0
        with self.session_factory() as session:
            return renew_usage_leases(session, self.api_instance_id)

    def renew_slots(self) -> int:
        """Renew the concurrent-request slot of every request this process holds open that holds one, with one
        `renew_slots` call (none while it holds none); returns how many slots it asked to renew."""
        with self._lock:
            slots = [(tenant_id, request_id) for request_id, tenant_id in self._slots.items()]
        if self._renew_slots is None or not slots:
            return 0
        self._renew_slots(slots)
        return len(slots)

    def close(self) -> None:
        """Stop the thread, then write the rows still queued (a later `open` starts a new thread)."""
        with self._lock:
            thread, stop, self._thread, self._stop = self._thread, self._stop, None, threading.Event()
        stop.set()
        self._wake.set()
        if thread is not None:
            thread.join(timeout=10)
        self.flush_opens()

    def _insert(self, rows: list[dict[str, Any]]) -> None:
        with self.session_factory() as session:
            open_usage(session, rows)

    def _insert_one(self, values: dict[str, Any]) -> BaseException | None:
        try:
            self._insert([values])
            return None
        except Exception as exc:  # noqa: BLE001 - handed to the request through its future
            log.exception("could not open the usage row of request %s", values["request_id"])
            return exc

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, args=(self._stop,), name="lorahost-usage-writer", daemon=True
            )
            self._thread.start()

    def _run(self, stop: threading.Event) -> None:
        next_checkpoint_s = self._clock() + self.interval_s
        while not stop.is_set():
            self._wake.wait(timeout=max(0.0, next_checkpoint_s - self._clock()))
            self._wake.clear()
            self._run_once(next_checkpoint_s)
            if self._clock() >= next_checkpoint_s:
                next_checkpoint_s = self._clock() + self.interval_s

    def _run_once(self, next_checkpoint_s: float) -> None:
        jobs: list[Callable[[], object]] = [self.flush_opens]
        if self._clock() >= next_checkpoint_s:
            jobs += [self.checkpoint, self.renew_leases, self.renew_slots]
        for job in jobs:  # each on its own: a failed checkpoint must not stop the lease renewals
            try:
                job()
            except Exception:  # noqa: BLE001 - the thread must survive a DB outage; the next round retries
                log.exception("usage writer: a write failed; retrying at the next checkpoint")


def meter_key(values: list[dict[str, Any]], meter: RequestMeter) -> tuple[int, int, str | None]:
    """The checkpoint key of what was just written for `meter` (from the written values, not the live meter)."""
    row = next(v for v in values if v["request_id"] == meter.request_id)
    return row["prompt_tokens"], row["completion_tokens"], row["worker_id"]


class UsageLedger:
    """Writes each request's usage row (opened when it starts, checkpointed, finished exactly once) and
    observes it in the API metrics."""

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        metrics: ApiMetrics | None = None,
        *,
        api_instance_id: str = "unknown",
        checkpoint_interval_s: float = 1.0,
        observe_output: OutputObserver | None = None,
        renew_slots: SlotRenewer | None = None,
    ) -> None:
        self.session_factory = session_factory
        self.metrics = metrics
        self.api_instance_id = api_instance_id
        self.observe_output = observe_output
        self.writer = UsageWriter(
            session_factory, checkpoint_interval_s, api_instance_id=api_instance_id, renew_slots=renew_slots
        )

    def start(self, tenant_id: str, request_id: str | None = None) -> RequestMeter:
        """A meter for a request that just passed authentication."""
        meter = RequestMeter(tenant_id=tenant_id)
        if request_id is not None:
            meter.request_id = request_id
        return meter

    def open(self, meter: RequestMeter, is_checkpointed: bool) -> None:
        """Start writing the request's `in_progress` row in the background (an admitted request; call once).
        `is_checkpointed`: checkpoint its delivered tokens while it runs (streams). The request's concurrent-request
        slot, when it holds one, is renewed with its row's lease until it is recorded."""
        if meter.opened is None and not meter.is_recorded:
            meter.opened = self.writer.open(
                meter.open_values(self.api_instance_id),
                meter if is_checkpointed else None,
                holds_slot=meter.release_slot is not None,
            )

    async def wait_opened(self, meter: RequestMeter) -> None:
        """Return once the request's row is durable (or its insert failed: logged; the final write inserts)."""
        opened = meter.opened
        if opened is None or opened.done():
            return
        with contextlib.suppress(Exception):  # the writer logged it; record() falls back to an insert
            await asyncio.wrap_future(opened)

    async def record(self, meter: RequestMeter, status: str, error_message: str | None = None) -> None:
        """Give the request's row its final values (first call only) off the event loop, then observe its
        metrics."""
        if meter.is_recorded:
            return
        meter.is_recorded = True  # before any await: a concurrent finaliser must not write a second row
        await release_slot(meter)
        self.writer.unwatch(meter)
        await self.wait_opened(meter)
        values = meter.usage_values(status, error_message)
        is_opened = meter.opened is not None and meter.opened.exception() is None
        self._observe_output(meter, status)
        await anyio.to_thread.run_sync(self._write, values, is_opened)
        if self.metrics is not None:
            self.metrics.observe_request(
                status,
                values["prompt_tokens"],
                values["completion_tokens"],
                values["ttft_ms"],
                values["tpot_ms"],
                values["e2e_ms"],
            )

    def close(self) -> None:
        """Stop the writer thread (queued rows are written first)."""
        self.writer.close()

    def _observe_output(self, meter: RequestMeter, status: str) -> None:
        if status != "ok" or self.observe_output is None or meter.predicted_output_tokens is None:
            return
        try:
            self.observe_output(meter.tenant_id, meter.adapter_version_id, meter.num_delivered_tokens)
        except Exception:  # noqa: BLE001 - a predictor's bookkeeping must never fail a request
            log.exception("could not observe the output length of request %s", meter.request_id)

    def _write(self, values: dict[str, Any], is_opened: bool) -> None:
        try:
            with self.session_factory() as session:
                finished = {k: v for k, v in values.items() if k not in ADMISSION_FIELDS}  # written at open
                if not (is_opened and finish_usage(session, finished)):
                    record_usage(session, **values)
        except DuplicateUsageError:
            log.error("BUG: request %s metered twice; the second row was not written", values["request_id"])
        except Exception:
            log.exception("could not write the usage row of request %s", values["request_id"])
            raise


async def release_slot(meter: RequestMeter) -> None:
    """Give back the request's concurrent-request slot, once (the request has ended, however it ended)."""
    release, meter.release_slot = meter.release_slot, None
    if release is None:
        return
    try:
        await anyio.to_thread.run_sync(release)
    except Exception:  # noqa: BLE001 - the slot's lease runs out instead (api/ratelimit.py)
        log.exception("could not release the concurrent-request slot of request %s", meter.request_id)


async def record_quietly(ledger: UsageLedger, meter: RequestMeter, status: str, message: str) -> None:
    """Record from a finaliser: log failures instead of masking the original exit."""
    try:
        await ledger.record(meter, status, message)
    except Exception:  # noqa: BLE001 - a finaliser must not raise; the ledger logged the cause
        log.warning("request %s: usage not recorded from the finaliser", meter.request_id)
