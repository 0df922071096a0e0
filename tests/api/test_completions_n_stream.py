"""A streamed request of n choices starts with choice 0 alone (api/inference/route.py,
api/inference/choice_streams.py): its first chunk reaches the client before a sibling has answered, the
siblings still open only after choice 0's first event (so they find its prompt in the prefix cache), a sibling
that cannot start once the stream has begun ends it with an error chunk, usage and [DONE] (metered `error`
once, every other stream closed), and a client that leaves aborts every choice, siblings still opening
included. The worker is scripted over HTTP; the test decides when each answer comes (events, no sleeps) and
drives the app through ASGI to see each chunk as it is sent.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import anyio
import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from cluster.protocol import GenerateRequest
from tests.api.asgi_support import Exchange, run
from tests.api.conftest import TenantHandle
from tests.api.test_completions_support import (
    BASE_MODEL,
    HeldBody,
    ScriptedWorkers,
    delta,
    events_response,
    refusal_response,
    sse_events,
    tokens_events,
    usage_rows,
)

MAX_WAIT_S = 60  # only a broken implementation waits this long: the gates below open on the test's events


class SentChunks:
    """What the app has sent: an event per choice index, set once one of its chunks is sent."""

    def __init__(self) -> None:
        self.sent: dict[int, asyncio.Event] = {}
        self.order: list[str] = []

    def on_message(self, message: dict[str, Any]) -> None:
        for event in sse_events(message.get("body", b"").decode()):
            for choice in event.get("choices", []) if isinstance(event, dict) else []:
                if not self.has_sent(choice["index"]):
                    self.order.append(f"choice {choice['index']} sent")
                self.event(choice["index"]).set()

    def event(self, index: int) -> asyncio.Event:
        return self.sent.setdefault(index, asyncio.Event())

    def has_sent(self, index: int) -> bool:
        return self.event(index).is_set()

    async def wait(self, *indices: int) -> None:
        with anyio.fail_after(MAX_WAIT_S):
            for index in indices:
                await self.event(index).wait()


def choice_of(request: GenerateRequest) -> int:
    """The choice index of a worker request (api/inference/choices.py: choice 0 keeps the request's id)."""
    head, _, tail = request.request_id.rpartition(".")
    return int(tail) if head and tail.isdigit() else 0


def stream(client: TestClient, tenant: TenantHandle, chunks: SentChunks, n: int, **drive: Any) -> Exchange:
    body = {
        "model": BASE_MODEL,
        "prompt": "hello world",
        "n": n,
        "max_tokens": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = tenant.headers | {"content-type": "application/json"}
    return run(
        client, "/v1/completions", headers, [json.dumps(body).encode()], on_message=chunks.on_message, **drive
    )


def test_choice_0_streams_before_a_sibling_has_answered_and_siblings_open_after_its_first_event(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle, db_session: Session
) -> None:
    chunks = SentChunks()

    async def answer(request: GenerateRequest) -> httpx.Response:
        index = choice_of(request)
        chunks.order.append(f"choice {index} requested")
        if index == 1:
            await chunks.wait(0)  # the worker answers choice 1 only once choice 0 reached the client
        chunks.order.append(f"choice {index} answered")
        return events_response(tokens_events(2))

    worker = workers.add("w1", answer=answer)
    exchange = stream(client, tenant, chunks, n=2)
    assert exchange.status == 200
    assert chunks.order.index("choice 0 sent") < chunks.order.index("choice 1 answered")
    # the sibling is asked for only after choice 0's first event: its prompt is in the prefix cache then
    assert chunks.order.index("choice 0 answered") < chunks.order.index("choice 1 requested")
    events = sse_events(exchange.body.decode())
    texts = {0: "", 1: ""}
    for event in events[:-2]:
        [choice] = event["choices"]
        texts[choice["index"]] += choice["text"]
    assert texts == {0: "t0 t1 ", 1: "t0 t1 "} and events[-1] == "[DONE]"
    [row] = usage_rows(db_session, tenant.id)
    assert (row.status, row.completion_tokens) == ("ok", 4)
    assert row.prompt_tokens == len(worker.requests[0].prompt_token_ids or [])  # once
    assert events[-2]["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize(("status", "error_type"), [(400, "bad_request"), (503, "draining")])
def test_a_sibling_refused_after_the_stream_began_ends_it_with_an_error_and_closes_the_others(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
    status: int,
    error_type: str,
) -> None:
    chunks = SentChunks()
    bodies: dict[int, HeldBody] = {}

    async def answer(request: GenerateRequest) -> httpx.Response:
        index = choice_of(request)
        if index == 1:  # refused once choices 0 and 2 have each sent a chunk and are still generating
            await chunks.wait(0, 2)
            return refusal_response(status, error_type)
        bodies[index] = HeldBody([delta(f"c{index} ", 10 + index)])
        return httpx.Response(200, stream=bodies[index])

    worker = workers.add("w1", answer=answer)
    exchange = stream(client, tenant, chunks, n=3)
    assert exchange.status == 200  # the response had started: the refusal cannot be an HTTP status any more
    events = sse_events(exchange.body.decode())
    assert sorted(e["choices"][0]["text"] for e in events[:2]) == ["c0 ", "c2 "]
    error, usage, done = events[2:]
    assert error["error"]["type"] == "worker_error" and done == "[DONE]"
    assert all(body.is_closed for body in bodies.values()) and sorted(bodies) == [0, 2]  # both aborted
    [row] = usage_rows(db_session, tenant.id)
    assert (row.status, row.completion_tokens) == ("error", 2)  # the two tokens sent
    assert row.prompt_tokens == len(worker.requests[0].prompt_token_ids or [])  # prefilled once, billed once
    assert usage["usage"] == {
        "prompt_tokens": row.prompt_tokens,
        "completion_tokens": 2,
        "total_tokens": row.prompt_tokens + 2,
    }


def test_a_client_leaving_aborts_choice_0_and_cancels_a_sibling_still_opening(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle, db_session: Session
) -> None:
    chunks = SentChunks()
    first = HeldBody([delta("a", 1)])
    opening: list[str] = []
    is_opening = asyncio.Event()

    async def answer(request: GenerateRequest) -> httpx.Response:
        if choice_of(request) == 0:
            return httpx.Response(200, stream=first)
        opening.append("opening")
        is_opening.set()
        try:
            await anyio.sleep_forever()  # the worker never answers choice 1: it is still opening
        except anyio.get_cancelled_exc_class():
            opening.append("cancelled")
            raise
        raise AssertionError("unreachable")

    workers.add("w1", answer=answer)

    async def leave() -> None:  # once choice 0 streams and choice 1 waits for its worker's answer
        await chunks.wait(0)
        with anyio.fail_after(MAX_WAIT_S):
            await is_opening.wait()

    exchange = stream(client, tenant, chunks, n=2, leave=leave)
    assert exchange.status == 200
    assert first.is_closed and opening == ["opening", "cancelled"]
    [row] = usage_rows(db_session, tenant.id)
    assert (row.status, row.completion_tokens) == ("aborted", 1)
    assert row.prompt_tokens > 0
