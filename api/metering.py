"""Metering: exactly one UsageRecord (and one metrics observation) per authenticated inference request.

A `RequestMeter` follows one request: it is started right after authentication, learns the adapter and
prompt size as the request is prepared, counts the tokens actually handed to the client and measures
latency at the API (what the client sees): TTFT = request arrival -> first delivered token, TPOT = mean gap
between delivered tokens, E2E = arrival -> finish.

Crash-safe rows (a `kill -9` of the API must not lose delivered tokens):
- `UsageLedger.open(meter, ...)`, called once the request is admitted, hands its `in_progress` row (owner:
  this process's api_instance_id, zero tokens) to the ledger's writer (its opener thread, which does nothing
  else), which inserts it at once, together with the other requests opened meanwhile, in one transaction. The
  insert runs while the request is
  routed and prefilled, so it costs the hot path nothing unless it is slower than the prefill:
  `wait_opened(meter)` is awaited before the first token is sent, so no token reaches a client before its
  request's row is durable (a crash before then bills nothing, and nothing was delivered).
- Streamed requests are checkpointed by the writer's checkpointer thread every `usage_checkpoint_interval_s`: one
  UPDATE for every open stream whose tokens changed. A crash bills the last checkpoint: at most one
  interval (plus one write) behind what was delivered, never more than was delivered.
- Non-streamed requests are not checkpointed: their tokens reach the client only with the response, so a
  crash before it bills nothing (0 prompt and 0 completion tokens), which is what was delivered.
- Every open row, streamed or not, carries a lease (`lease_renewed_at`, set when the row is opened). The same
  thread renews the leases of the rows this process holds open every quarter of `usage_lease_timeout_s`
  (settings.metering.renewal_interval_s; at least a checkpoint interval apart), with one UPDATE
  (registry.usage.renew_usage_leases; none while it holds no open row), skipping the rows renewed or
  checkpointed in the last half interval (a checkpoint is a sign of life too) and the rows another write holds
  locked (never waiting). The usage sweep closes a row whose latest sign of life (start, lease renewal or
  checkpoint) is older than `usage_lease_timeout_s` (its owner is gone: killed and restarted under another
  api_instance_id, or scaled down). Lease renewals never touch `checkpointed_at`: that stays the moment the
  billed tokens were counted.
- The same renewal also renews the concurrent-request slots (a plan's max_concurrent_requests, api/ratelimit.py)
  of the open requests that hold one, with one call of the ledger's `renew_slots` for all (one Redis round
  trip). A slot not renewed for `usage_lease_timeout_s` stops counting, so a killed process's slots are free
  again within that lease, like its rows; the slot renewal runs even when the usage UPDATE fails.
- `UsageLedger.record(meter, status)` then gives the row its final values once (later calls are no-ops), through
  the writer's finisher thread (with the other requests ended meanwhile, in one transaction): an
  UPDATE of the open row, never a second row (an INSERT when the row was never opened: a request rejected
  before admission, or an open insert that failed).
- A restarted process closes what its predecessor left open (registry.usage.close_interrupted_usage), and
  a periodic sweep closes the rows of dead workers (close_orphaned_usage) and of expired leases
  (close_expired_usage), all as `interrupted`. A row closed while its API still served it (a late renewal)
  is given its true final values by `record` all the same.
- While the database cannot be reached, an open row, a checkpoint or a final write that fails is appended to
  the process's usage spool on local disk (fsync'd: api/usage_spool.py) instead, and counts as written; the
  writer thread replays the spool, before its checkpoints, once the database answers, and a process restarted
  under the same api_instance_id replays its predecessor's spool before it closes that predecessor's rows.
The open row also carries the output-length prediction and its inputs (ADMISSION_FIELDS); an `ok`
request's true output length is handed to `observe_output` as it is recorded. `record` also gives back the
request's concurrent-request slot (a plan's max_concurrent_requests, api/ratelimit.py), so it is released
exactly once however the request ended. `RequestMeter` (api/request_meter.py) holds one request's values and
lists the statuses; `UsageWriter` (api/usage_writer.py) is the threads. Writes run on fresh DB sessions in
threads, so the request's own session and the event loop are never involved.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from api.metrics import ApiMetrics
from api.request_meter import RequestMeter
from api.usage_spool import UsageSpool
from api.usage_writer import SlotRenewer, UsageWriter

log = logging.getLogger(__name__)
# Told each `ok` request's tenant id, adapter key (the adapter version id; None: the base model) and true
# output tokens, on the event loop (the learned length predictor's history of that tenant on that adapter:
# api/inference/learned_predictor.py).
OutputObserver = Callable[[str, str | None, int], None]


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
        renewal_interval_s: float | None = None,
        observe_output: OutputObserver | None = None,
        renew_slots: SlotRenewer | None = None,
        spool: UsageSpool | None = None,
    ) -> None:
        self.session_factory = session_factory
        self.metrics = metrics
        self.api_instance_id = api_instance_id
        self.observe_output = observe_output
        self.spool = spool
        self.writer = UsageWriter(
            session_factory,
            checkpoint_interval_s,
            renewal_interval_s=renewal_interval_s,
            api_instance_id=api_instance_id,
            renew_slots=renew_slots,
            spool=spool,
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
        # written by the writer's finisher thread; raises if neither written nor spooled (logged there)
        await asyncio.wrap_future(self.writer.finish(values, is_opened))
        if self.metrics is not None:
            self.metrics.observe_request(
                status,
                values["prompt_tokens"],
                values["completion_tokens"],
                values["ttft_ms"],
                values["tpot_ms"],
                values["e2e_ms"],
            )
            self.metrics.observe_stages(meter.stage_durations_ms())

    def close(self) -> None:
        """Stop the writer thread (queued rows are written first)."""
        self.writer.close()

    def _observe_output(self, meter: RequestMeter, status: str) -> None:
        if status != "ok" or self.observe_output is None or meter.recorded_prediction() is None:
            return
        try:
            self.observe_output(meter.tenant_id, meter.adapter_version_id, meter.num_delivered_tokens)
        except Exception:
            log.exception("could not observe the output length of request %s", meter.request_id)


async def release_slot(meter: RequestMeter) -> None:
    """Give back the request's concurrent-request slot, once (the request has ended, however it ended)."""
    release, meter.release_slot = meter.release_slot, None
    if release is None:
        return
    try:
        await release()
    except Exception:
        log.exception("could not release the concurrent-request slot of request %s", meter.request_id)


async def record_quietly(ledger: UsageLedger, meter: RequestMeter, status: str, message: str) -> None:
    """Record from a finaliser: log failures instead of masking the original exit."""
    try:
        await ledger.record(meter, status, message)
    except Exception:  # noqa: BLE001 - a finaliser must not raise; the ledger logged the cause
        log.warning("request %s: usage not recorded from the finaliser", meter.request_id)
