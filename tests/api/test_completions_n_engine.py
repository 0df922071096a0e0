"""`n` choices through an embedded worker with the tiny model and an adapter (api/inference/choices.py):
the siblings of choice 0 find its prompt in the prefix cache (counted by the engine, not timed), a seeded
response is reproducible as a whole, alone or beside another tenant's requests, and a client that leaves
aborts every choice and is billed the prompt once plus what was delivered; best_of returns the sequence of
the highest mean logprob among those n would return, billing them all.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from gpu_workers.engine.async_engine import AsyncLLMEngine
from gpu_workers.engine.config import EngineConfig
from gpu_workers.worker.embedded import EmbeddedWorker
from scheduler.core.engine_stats import EngineStats
from tests.api.asgi_support import run
from tests.api.conftest import TenantHandle, create_tenant, upload
from tests.api.test_completions_support import sse_events, usage_rows
from tests.polling import wait_for

pytestmark = pytest.mark.slow
PROMPT = "the tenant cache memory batch queue worker latency " * 8  # several full KV blocks
BLOCK_SIZE = EngineConfig.model_fields["block_size"].default


def stats(worker: EmbeddedWorker) -> EngineStats:
    result: EngineStats = worker.runtime.require_service().engine.engine_stats()
    return result


def with_adapter(api: TestClient, demo_adapter: Path, name: str) -> TenantHandle:
    """A new tenant owning a ready adapter called `name`."""
    tenant = create_tenant(api, name)
    files = [demo_adapter / "adapter_config.json", demo_adapter / "adapter_model.safetensors"]
    uploaded = upload(api, tenant, name, files)
    assert uploaded.status_code == 202 and uploaded.json()["version"]["status"] == "ready", uploaded.text
    return tenant


def texts(response: Any) -> list[str]:
    assert response.status_code == 200, response.text
    return [c["text"] for c in response.json()["choices"]]


@pytest.mark.parametrize("is_stream", [False, True])
def test_siblings_prefill_only_the_prompt_s_last_partial_block(
    embedded: tuple[TestClient, EmbeddedWorker], demo_adapter: Path, db_session: Session, is_stream: bool
) -> None:
    api, worker = embedded
    tenant = with_adapter(api, demo_adapter, "ad")
    before = stats(worker)
    body = {"model": "ad", "prompt": PROMPT, "n": 3, "max_tokens": 4, "seed": 5, "ignore_eos": True}
    if is_stream:  # choice 0 streams at once; its siblings still open only after its first event
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    response = api.post("/v1/completions", json=body, headers=tenant.headers)
    assert response.status_code == 200, response.text
    if is_stream:
        chunks = [e for e in sse_events(response.text) if e != "[DONE]"]
        assert {c["choices"][0]["index"] for c in chunks if c["choices"]} == {0, 1, 2}
        usage = chunks[-1]["usage"]
    else:
        assert len(texts(response)) == 3
        usage = response.json()["usage"]
    after = stats(worker)
    [row] = usage_rows(db_session, tenant.id)
    num_cacheable = (row.prompt_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert num_cacheable >= 2 * BLOCK_SIZE
    # choice 0 found nothing (a new tenant's namespace); choices 1 and 2 every full block of the prompt
    assert after.num_prefix_cache_hit_tokens - before.num_prefix_cache_hit_tokens == 2 * num_cacheable
    assert (row.status, row.completion_tokens) == ("ok", 12)
    assert usage["prompt_tokens"] == row.prompt_tokens  # once


def test_a_seeded_n_response_is_reproducible_alone_and_beside_another_tenant(
    embedded: tuple[TestClient, EmbeddedWorker], demo_adapter: Path
) -> None:
    api, _ = embedded
    tenant = with_adapter(api, demo_adapter, "ad")
    other = with_adapter(api, demo_adapter, "other")
    body = {"model": "ad", "prompt": PROMPT, "n": 3, "max_tokens": 8, "seed": 1234, "temperature": 1.0}
    alone = texts(api.post("/v1/completions", json=body, headers=tenant.headers))
    assert len(set(alone)) > 1, "the choices of one seeded request should differ"
    assert texts(api.post("/v1/completions", json=body, headers=tenant.headers)) == alone
    # another tenant's requests first (not from a second thread: the test's one rolled-back DB connection is
    # not thread-safe; tests/api/test_completions_n_e2e.py runs tenants side by side through uvicorn)
    beside: dict[str, Any] = {}
    for i in range(3):
        other_body = {"model": "other", "prompt": f"another tenant's prompt {i}", "max_tokens": 16}
        beside[f"other-{i}"] = api.post("/v1/completions", json=other_body, headers=other.headers)
    streamed = api.post("/v1/completions", json=body | {"stream": True}, headers=tenant.headers)
    assert all(r.status_code == 200 for r in beside.values())
    chunks = [e for e in sse_events(streamed.text) if e != "[DONE]"]
    joined = ["", "", ""]
    for chunk in chunks:
        for choice in chunk["choices"]:
            joined[choice["index"]] += choice["text"]
    assert joined == alone
    chat = {
        "model": "ad",
        "messages": [{"role": "user", "content": "hi"}],
        "n": 2,
        "max_tokens": 6,
        "seed": 9,
    }
    first = api.post("/v1/chat/completions", json=chat, headers=tenant.headers).json()
    again = api.post("/v1/chat/completions", json=chat, headers=tenant.headers).json()
    assert [c["message"] for c in first["choices"]] == [c["message"] for c in again["choices"]]
    assert [c["index"] for c in first["choices"]] == [0, 1]


def test_best_of_returns_the_choice_with_the_highest_mean_logprob_and_bills_every_sequence(
    embedded: tuple[TestClient, EmbeddedWorker], demo_adapter: Path, db_session: Session
) -> None:
    api, _ = embedded
    tenant = with_adapter(api, demo_adapter, "ad")
    body = {"model": "ad", "prompt": PROMPT, "max_tokens": 8, "seed": 21, "temperature": 1.0}
    # the same seeds rule: n=3's choices are the three sequences best_of=3 ranks
    every = api.post("/v1/completions", json=body | {"n": 3, "logprobs": 0}, headers=tenant.headers).json()
    means = [
        sum(c["logprobs"]["token_logprobs"]) / len(c["logprobs"]["token_logprobs"]) for c in every["choices"]
    ]
    assert len(set(means)) == 3, "the sampled sequences should differ"
    best = api.post("/v1/completions", json=body | {"best_of": 3}, headers=tenant.headers)
    assert texts(best) == [every["choices"][means.index(max(means))]["text"]]
    _, row = usage_rows(db_session, tenant.id)
    assert (row.status, row.completion_tokens) == ("ok", every["usage"]["completion_tokens"])  # all three
    assert best.json()["usage"] == every["usage"]


def _leave_once_generating(
    worker: EmbeddedWorker,
    monkeypatch: pytest.MonkeyPatch,
    num_tokens: int,
    num_choices: int,
    received: Callable[[], set[int]] | None = None,
) -> Callable[[], Any]:
    """Leave once the engine has produced `num_tokens` more tokens, long before the request can finish, and
    (`received`: the choice indices the client has had chunks of) once every choice has reached the client.

    From then on the engine's loop takes no step until it has seen `num_choices` aborts: on a loaded machine
    the tiny model could otherwise finish a choice by length before the disconnect reaches the worker.
    """
    async_engine = worker.runtime.require_service().engine
    assert isinstance(async_engine, AsyncLLMEngine)
    produced_before = stats(worker).num_output_tokens
    aborted_before = stats(worker).num_aborted
    is_held = threading.Event()
    has_pending_work = async_engine._has_pending_work

    def step_unless_held() -> bool:  # called by the loop under its lock; False: it waits for a notify
        counters = async_engine.engine.core.counters
        if is_held.is_set() and counters.num_aborted - aborted_before < num_choices:
            return False
        return bool(has_pending_work())

    monkeypatch.setattr(async_engine, "_has_pending_work", step_unless_held)

    async def leave() -> None:
        deadline = time.monotonic() + 60
        while True:
            now = await anyio.to_thread.run_sync(stats, worker)
            is_received = received is None or len(received()) >= num_choices
            if (
                now.num_running >= num_choices
                and now.num_output_tokens - produced_before >= num_tokens
                and is_received
            ):
                is_held.set()
                return
            assert time.monotonic() < deadline, "the choices never ran together on the worker"
            await anyio.sleep(0.002)

    return leave


@pytest.mark.parametrize("is_stream", [True, False])
def test_a_client_leaving_aborts_every_choice_and_is_billed_the_prompt_once(
    embedded: tuple[TestClient, EmbeddedWorker],
    db_session: Session,
    monkeypatch: pytest.MonkeyPatch,
    is_stream: bool,
) -> None:
    api, worker = embedded
    tenant = create_tenant(api, "leaver")
    # within the tiny model's 1,024 positions with PROMPT (66 tokens); long, so the leave lands mid-run
    max_tokens = 900
    body = {
        "model": "lorahost-base",
        "prompt": PROMPT,
        "n": 2,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": is_stream,
    }
    before = stats(worker)
    seen: set[int] = set()

    def see_choices(message: dict[str, Any]) -> None:  # the choice indices of the chunks sent so far
        if message["type"] == "http.response.body":
            seen.update(int(i) for i in re.findall(rb'"index":\s*(\d+)', message.get("body", b"")))

    exchange = run(
        api,
        "/v1/completions",
        tenant.headers | {"content-type": "application/json"},
        [json.dumps(body).encode()],
        # streamed: the siblings' first chunks follow choice 0's, so leave only once both reached the client
        leave=_leave_once_generating(
            worker, monkeypatch, 10, num_choices=2, received=(lambda: seen) if is_stream else None
        ),
        on_message=see_choices,
    )
    assert exchange.status == (200 if is_stream else 499), exchange.body  # 499: left before the response
    assert wait_for(lambda: stats(worker).num_running == 0), "a choice still runs on the engine"
    after = stats(worker)
    assert after.num_aborted - before.num_aborted == 2
    [row] = usage_rows(db_session, tenant.id)
    assert row.status == "aborted", (row.status, row.error_message)
    assert row.prompt_tokens == len(api.app.state.services.tokenizer.encode(PROMPT))  # type: ignore[attr-defined]
    produced = after.num_output_tokens - before.num_output_tokens
    assert 0 < row.completion_tokens <= produced < 2 * max_tokens
    if is_stream:  # billed: exactly the tokens sent, one chunk per token delta
        sent = [e for e in sse_events(exchange.body.decode()) if e != "[DONE]" and e["choices"]]
        assert {c["choices"][0]["index"] for c in sent} == {0, 1}
        assert len(sent) <= row.completion_tokens
