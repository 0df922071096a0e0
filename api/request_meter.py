"""One request's meter: what it used, how fast it was served, and the values of its usage row.

A `RequestMeter` follows one request: it is started right after authentication, learns the adapter and
prompt size as the request is prepared, counts the tokens actually handed to the client and measures
latency at the API (what the client sees): TTFT = request arrival -> first delivered token, TPOT = mean gap
between delivered tokens, E2E = arrival -> finish.

A request's open (`in_progress`) row also carries the output-length prediction and its inputs (max_tokens, is_chat, has_stop;
ADMISSION_FIELDS, never updated after; nothing derived from the prompt's content), the training data of the
length predictor (registry/predictor_training.py); an `ok` request's true output length is handed to
`observe_output` (the predictor's history of that tenant on that adapter) as it is recorded.
Statuses:
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
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from registry.models import OPEN_USAGE_STATUS, new_id, utcnow

MAX_ERROR_MESSAGE_CHARS = 1000
MAX_MODEL_NAME_CHARS = 200  # UsageRecord.model_name is a VARCHAR(200)
# Columns written with the open row that the final update leaves alone (RequestMeter.admission_values).
ADMISSION_FIELDS = frozenset({"max_tokens", "is_chat", "has_stop"})
# The stages of a request before its first token, in order, each named for what ends it (RequestMeter.mark):
# prepare  charged, parsed, resolved, tokenized, admitted and predicted (api/inference/prepare.py)
# route    a worker chosen and its first event read (api/inference/route.py)
# durable  the in_progress row written, beyond the routing it overlaps (api/metering.py)
# respond  the first token handed to the client (api/inference/respond.py)
REQUEST_STAGES = ("prepare", "route", "durable", "respond")


def storable_text(text: str, max_chars: int) -> str:
    """`text` as any database stores it: at most `max_chars` characters, a lone surrogate or a NUL (PostgreSQL
    text cannot hold one) replaced by U+FFFD. The row of a request is written whatever text the client sent
    (a model name, or an error message quoting it)."""
    cleaned = text[:max_chars].encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return cleaned.replace("\x00", "\ufffd")[:max_chars]


@dataclass
class RequestMeter:
    """What one request used and how fast it was served (filled in as the request proceeds)."""

    tenant_id: str
    model_name: str = ""
    base_model_name: str | None = None  # the base model the request runs on, once resolved
    request_id: str = field(default_factory=lambda: f"req-{new_id()}")
    adapter_id: str | None = None
    adapter_version_id: str | None = None
    worker_id: str | None = None
    num_prompt_tokens: int = 0
    predicted_output_tokens: int | None = (
        None  # api/inference/predict.py; None: refused before the prediction
    )
    # what the prediction saw (api/inference/predict.py), recorded for the predictor's training job
    max_tokens: int | None = None
    is_chat: bool | None = None
    has_stop: bool | None = None
    num_delivered_tokens: int = 0  # over every choice of the request (OpenAI's `n`): what is billed
    num_choices: int = 1
    is_prefilled: bool = False
    started_at: datetime = field(default_factory=utcnow)
    started_s: float = field(default_factory=time.perf_counter)
    first_token_s: float | None = None
    last_token_s: float | None = None
    stage_ends_s: dict[str, float] = field(default_factory=dict)  # REQUEST_STAGES -> perf_counter at its end
    is_recorded: bool = False
    opened: Future[None] | None = None  # the in_progress row's insert (None: never opened)
    # gives back its concurrent-request slot, on the event loop (api/ratelimit.py release_slot_async)
    release_slot: Callable[[], Awaitable[None]] | None = None

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

    def mark(self, stage: str) -> None:
        """Note that one of REQUEST_STAGES (not "respond": the first delivery ends it) ended now."""
        self.stage_ends_s[stage] = time.perf_counter()

    def stage_durations_ms(self) -> dict[str, float]:
        """How long each stage took, in ms, for a request that delivered a token after passing every stage."""
        ends = {**self.stage_ends_s, "respond": self.first_token_s}
        if any(ends.get(stage) is None for stage in REQUEST_STAGES):
            return {}
        durations, previous = {}, self.started_s
        for stage in REQUEST_STAGES:
            end = ends[stage]
            assert end is not None
            durations[stage] = (end - previous) * 1000
            previous = end
        return durations

    def withdraw_undelivered(self) -> None:
        """Un-count tokens that were received but will never reach the client (a non-streamed response that
        is not sent); the request stays prefilled."""
        self.num_delivered_tokens = 0

    def latencies_ms(self, finished_s: float) -> tuple[float | None, float | None, float]:
        """(TTFT, mean TPOT, E2E) in ms; TTFT is None without a token, TPOT without a second one. With n choices
        (generated side by side) TPOT is per choice: the span over the mean number of tokens of a choice."""
        e2e = (finished_s - self.started_s) * 1000
        if self.first_token_s is None:
            return None, None, e2e
        ttft = (self.first_token_s - self.started_s) * 1000
        tpot = None
        num_per_choice = self.num_delivered_tokens / self.num_choices
        if num_per_choice > 1 and self.last_token_s is not None:
            tpot = (self.last_token_s - self.first_token_s) * 1000 / (num_per_choice - 1)
        return ttft, tpot, e2e

    @property
    def is_length_sample(self) -> bool:
        """True when the row may teach and score the output-length predictor: one choice (a row of n choices
        sums n outputs, which no one-sequence prediction describes; it records no prediction)."""
        return self.num_choices == 1

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
            "model_name": storable_text(self.model_name or "unknown", MAX_MODEL_NAME_CHARS),
            "base_model_name": self.base_model_name,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "predicted_output_tokens": self.recorded_prediction(),
            **self.admission_values(),
            "status": OPEN_USAGE_STATUS,
            "worker_id": self.worker_id,
            "api_instance_id": api_instance_id,
            "started_at": self.started_at,
            "lease_renewed_at": utcnow(),  # not started_at: a request held through a cold start is not overdue
        }

    def recorded_prediction(self) -> int | None:
        """The prediction the row records (None for n choices: not a length sample)."""
        return self.predicted_output_tokens if self.is_length_sample else None

    def admission_values(self) -> dict[str, Any]:
        """The prediction's inputs (ADMISSION_FIELDS): written when the row opens, never changed after (None
        for n choices: not a training sample of the length predictor)."""
        if not self.is_length_sample:
            return dict.fromkeys(ADMISSION_FIELDS)
        return {
            "max_tokens": self.max_tokens,
            "is_chat": self.is_chat,
            "has_stop": self.has_stop,
        }

    def checkpoint_key(self) -> tuple[int, int, str | None]:
        """What a checkpoint records that can change: (billed prompt tokens, delivered tokens, worker)."""
        return self.billed_prompt_tokens(OPEN_USAGE_STATUS), self.num_delivered_tokens, self.worker_id

    def checkpoint_values(self, checkpointed_at: datetime) -> dict[str, Any]:
        """The open row's columns as of now (registry.usage_batches.CHECKPOINT_FIELDS); `checkpointed_at` was taken
        before this call (every token counted by then is in the checkpoint)."""
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
            "model_name": storable_text(self.model_name or "unknown", MAX_MODEL_NAME_CHARS),
            "base_model_name": self.base_model_name,
            "prompt_tokens": self.billed_prompt_tokens(status),
            "completion_tokens": delivered,
            "predicted_output_tokens": self.recorded_prediction(),
            **self.admission_values(),
            "ttft_ms": ttft if status != "rejected" else None,
            "tpot_ms": tpot if status != "rejected" else None,
            "e2e_ms": e2e,
            "status": status,
            "worker_id": self.worker_id,
            "error_message": storable_text(error_message, MAX_ERROR_MESSAGE_CHARS) if error_message else None,
            "started_at": self.started_at,
            "finished_at": utcnow(),
        }
