"""What the API sends a worker: the internal token and the request, never state from an earlier answer (a
cookie a worker set is not sent with the next request, whoever's), with the client's timeouts."""

from __future__ import annotations

import asyncio
import json

import httpx

from api.worker_client import WorkerClient
from cluster.membership import WorkerRecord
from cluster.protocol import GenerateRequest
from scheduler.routing.router import RouteRequest

ROUTE = RouteRequest("base", "acme/a", 10, 4, adapter_rank=8, tenant_id="t1")
LINES = [{"type": "delta", "text": "a", "token_ids": [5]}, {"type": "final", "finish_reason": "length"}]


def test_a_cookie_set_by_a_worker_is_not_sent_with_the_next_request() -> None:
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        body = "".join(json.dumps(e) + "\n" for e in LINES).encode()
        return httpx.Response(200, content=body, headers={"Set-Cookie": f"session=of-{len(seen)}; Path=/"})

    async def run() -> list[str]:
        client = WorkerClient.create("secret", transport=httpx.MockTransport(handle), read_timeout_s=7.0)
        listing = [WorkerRecord("w1", "http://w1", "base", max_num_seqs=8)]
        texts = []
        for i in range(3):
            stream = await client.start(ROUTE, listing, GenerateRequest(request_id=f"r{i}", prompt="x"))
            texts.append(stream.first.text or "")
            await stream.aclose()
        await client.aclose()
        return texts

    assert asyncio.run(run()) == ["a", "a", "a"]
    assert len(seen) == 3
    assert all("cookie" not in request.headers for request in seen)
    assert all(request.headers["authorization"] == "Bearer secret" for request in seen)
    assert [GenerateRequest.model_validate_json(r.content).request_id for r in seen] == ["r0", "r1", "r2"]
    assert seen[0].extensions["timeout"]["read"] == 7.0
    assert seen[0].url.path == "/internal/v1/generate"
