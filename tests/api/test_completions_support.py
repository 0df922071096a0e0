"""Support for the inference tests (no tests here): scripted workers over HTTP, rows, SSE parsing.

`ScriptedWorkers` speaks the real internal protocol (NDJSON GenerateEvents) through an httpx transport, so
routing, retries, error mapping and metering run unchanged while a test decides what each worker answers.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.worker_client import WorkerClient
from cluster.membership import InMemoryWorkerDirectory, WorkerRecord
from cluster.protocol import GenerateRequest
from registry import repository
from registry.models import AdapterVersion, UsageRecord
from scheduler.core.scheduler_stats import SchedulerStats

if TYPE_CHECKING:
    from tests.api.conftest import TenantHandle

BASE_MODEL = "lorahost-base"


def delta(text: str, token_id: int) -> dict[str, Any]:
    """One delta event carrying one token."""
    return {"type": "delta", "text": text, "token_ids": [token_id]}


def final(num_prompt: int = 0, num_output: int = 0, finish_reason: str = "length") -> dict[str, Any]:
    """A final event."""
    return {
        "type": "final",
        "finish_reason": finish_reason,
        "num_prompt_tokens": num_prompt,
        "num_output_tokens": num_output,
    }


def tokens_events(num_tokens: int, finish_reason: str = "length") -> list[dict[str, Any]]:
    """num_tokens deltas ("t0 ", "t1 ", ...) then a final."""
    return [delta(f"t{i} ", 10 + i) for i in range(num_tokens)] + [final(0, num_tokens, finish_reason)]


# A test's own answer to each generate request (it may wait on the test's events before answering).
Answer = Callable[[GenerateRequest], Awaitable[httpx.Response]]


@dataclass
class ScriptedWorker:
    """A worker whose answer a test scripts: events to stream, an HTTP error, being unreachable, or an answer
    per request (`answer`, which overrides the others)."""

    worker_id: str
    events: list[dict[str, Any]] = field(default_factory=lambda: tokens_events(3))
    status_code: int = 200
    error_type: str = "bad_request"
    is_down: bool = False
    answer: Answer | None = None
    requests: list[GenerateRequest] = field(default_factory=list)
    auth_headers: list[str | None] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.worker_id}.workers.test"


class ScriptedWorkers:
    """A directory of scripted workers plus the transport that reaches them."""

    def __init__(self) -> None:
        self.directory = InMemoryWorkerDirectory()
        self.workers: dict[str, ScriptedWorker] = {}

    def add(
        self,
        worker_id: str,
        *,
        base_model: str = BASE_MODEL,
        num_running: int = 0,
        device_adapters: tuple[str, ...] = (),
        **script: Any,
    ) -> ScriptedWorker:
        worker = ScriptedWorker(worker_id, **script)
        self.workers[f"{worker_id}.workers.test"] = worker
        record = WorkerRecord(
            worker_id,
            worker.url,
            base_model,
            max_num_seqs=8,
            scheduler=SchedulerStats(num_running=num_running, device_adapters=device_adapters),
        )
        self.directory.heartbeat(record, ttl_s=3600)
        return worker

    async def _handle(self, request: httpx.Request) -> httpx.Response:
        worker = self.workers[request.url.host]
        if worker.is_down:
            raise httpx.ConnectError("connection refused", request=request)
        worker.requests.append(GenerateRequest.model_validate_json(request.content))
        worker.auth_headers.append(request.headers.get("authorization"))
        if worker.answer is not None:
            return await worker.answer(worker.requests[-1])
        if worker.status_code != 200:
            body = {"error": {"type": worker.error_type, "message": f"scripted {worker.status_code}"}}
            return httpx.Response(worker.status_code, json=body)
        return httpx.Response(200, content=_ndjson(worker.events))

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self._handle)

    def install(self, client: TestClient, internal_token: str = "test-internal-token") -> None:
        """Publish the directory and a worker client on the app's services."""
        services = client.app.state.services  # type: ignore[attr-defined]
        services.worker_directory = self.directory
        services.internal_token = internal_token
        services.worker_client = WorkerClient.create(
            services.resolved_internal_token, transport=self.transport(), router=services.router
        )


async def _ndjson(events: list[dict[str, Any]]) -> AsyncIterator[bytes]:
    for event in events:
        yield (json.dumps(event) + "\n").encode()


def events_response(events: list[dict[str, Any]]) -> httpx.Response:
    """A worker's 200 answer streaming `events`."""
    return httpx.Response(200, content=_ndjson(events))


def refusal_response(status_code: int, error_type: str) -> httpx.Response:
    """A worker's refusal before streaming (`error_type`: a worker error code)."""
    return httpx.Response(status_code, json={"error": {"type": error_type, "message": "scripted"}})


class HeldBody(httpx.AsyncByteStream):
    """A generate response body that streams `events` and then holds, as a generation still running, until the
    API closes it (which is how it aborts the request: `is_closed`)."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events
        self.is_closed = False
        self._closed = asyncio.Event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for line in _ndjson(self.events):
            yield line
        await self._closed.wait()

    async def aclose(self) -> None:
        self.is_closed = True
        self._closed.set()


def add_ready_version(
    session: Session,
    tenant_id: str,
    name: str,
    *,
    visibility: str = "private",
    rank: int = 4,
    use_dora: bool = False,
    target_modules: list[str] | None = None,
) -> AdapterVersion:
    """A ready adapter version row (no files: scripted workers never read them)."""
    adapter = repository.get_or_create_adapter(
        session, tenant_id, name, base_model_name=BASE_MODEL, visibility=visibility
    )
    number = len(adapter.versions) + 1
    version = repository.add_adapter_version(
        session,
        tenant_id,
        adapter,
        status="ready",
        sha256=f"{number:064d}",
        rank=rank,
        use_dora=use_dora,
        target_modules=target_modules or ["q_proj", "v_proj"],
        config_blob_key=f"k/{name}/{number}/c",
        weights_blob_key=f"k/{name}/{number}/w",
    )
    session.commit()
    session.refresh(adapter)
    return version


def usage_rows(session: Session, tenant_id: str) -> list[UsageRecord]:
    """The tenant's usage rows, oldest first (fresh from the database)."""
    session.expire_all()
    query = select(UsageRecord).where(UsageRecord.tenant_id == tenant_id).order_by(UsageRecord.started_at)
    return list(session.scalars(query))


def sse_events(text: str) -> list[Any]:
    """The `data:` payloads of an SSE body, JSON-decoded except the final "[DONE]"."""
    out: list[Any] = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            payload = block[len("data: ") :]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def complete(
    client: TestClient, tenant: TenantHandle, path: str = "/v1/completions", **body: object
) -> httpx.Response:
    """POST a completion (the base model, "hello world" unless `body` says otherwise) as `tenant`."""
    return client.post(
        path, json={"model": BASE_MODEL, "prompt": "hello world", **body}, headers=tenant.headers
    )
