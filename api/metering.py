"""Metering: exactly one UsageRecord (and one metrics observation) per authenticated inference request.

A `RequestMeter` follows one request: it is started right after authentication, learns the adapter and
prompt size as the request is prepared, counts the tokens actually handed to the client and measures
latency at the API (what the client sees): TTFT = request arrival -> first delivered token, TPOT = mean gap
between delivered tokens, E2E = arrival -> finish.

`UsageLedger.record(meter, status)` writes the row once (later calls are no-ops) on a fresh DB session in a
worker thread, so the request's own session and the event loop are never involved. Statuses:
  ok        the worker finished; prompt + delivered tokens
  error     the worker failed; prompt tokens once prefill happened (a token was delivered or the worker
            reported its prompt count) + delivered tokens
  aborted   the client went away (the worker request is aborted); prompt tokens once a token was delivered
            + the tokens delivered until then (streamed: sent; non-streamed: received for the response)
  rejected  refused before any work (bad request, unknown model, rate limit, no worker): zero tokens
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import anyio.to_thread
from sqlalchemy.orm import Session, sessionmaker

from api.metrics import ApiMetrics
from registry.models import new_id, utcnow
from registry.usage import DuplicateUsageError, record_usage

log = logging.getLogger(__name__)
MAX_ERROR_MESSAGE_CHARS = 1000


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
    num_delivered_tokens: int = 0
    is_prefilled: bool = False
    started_at: datetime = field(default_factory=utcnow)
    started_s: float = field(default_factory=time.perf_counter)
    first_token_s: float | None = None
    last_token_s: float | None = None
    is_recorded: bool = False

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
        """Prompt tokens billed for a final status (see the module docstring)."""
        if status == "ok" or (status in ("error", "aborted") and self.is_prefilled):
            return self.num_prompt_tokens
        return 0

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
            "ttft_ms": ttft if status != "rejected" else None,
            "tpot_ms": tpot if status != "rejected" else None,
            "e2e_ms": e2e,
            "status": status,
            "worker_id": self.worker_id,
            "error_message": error_message[:MAX_ERROR_MESSAGE_CHARS] if error_message else None,
            "started_at": self.started_at,
            "finished_at": utcnow(),
        }


class UsageLedger:
    """Writes each request's usage row exactly once and observes it in the API metrics."""

    def __init__(self, session_factory: sessionmaker[Session], metrics: ApiMetrics | None = None) -> None:
        self.session_factory = session_factory
        self.metrics = metrics

    def start(self, tenant_id: str, request_id: str | None = None) -> RequestMeter:
        """A meter for a request that just passed authentication."""
        meter = RequestMeter(tenant_id=tenant_id)
        if request_id is not None:
            meter.request_id = request_id
        return meter

    async def record(self, meter: RequestMeter, status: str, error_message: str | None = None) -> None:
        """Write the request's row (first call only) off the event loop, then observe its metrics."""
        if meter.is_recorded:
            return
        meter.is_recorded = True  # before any await: a concurrent finaliser must not write a second row
        values = meter.usage_values(status, error_message)
        await anyio.to_thread.run_sync(self._write, values)
        if self.metrics is not None:
            self.metrics.observe_request(
                status,
                values["prompt_tokens"],
                values["completion_tokens"],
                values["ttft_ms"],
                values["tpot_ms"],
                values["e2e_ms"],
            )

    def _write(self, values: dict[str, Any]) -> None:
        try:
            with self.session_factory() as session:
                record_usage(session, **values)
        except DuplicateUsageError:
            log.error("BUG: request %s metered twice; the second row was not written", values["request_id"])
        except Exception:
            log.exception("could not write the usage row of request %s", values["request_id"])
            raise
