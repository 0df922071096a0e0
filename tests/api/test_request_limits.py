"""Inference request bounds (api/request_limits.py): body size, prompt characters, JSON nesting, seed range.

One tenant's huge or hostile body must be refused cheaply, before it is read in full or tokenized.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.orm import Session

from api.prompting import BaseModelTokenizer
from api.request_limits import exceeds_depth
from tests.api.asgi_support import run
from tests.api.conftest import TenantHandle
from tests.api.test_completions_support import BASE_MODEL, ScriptedWorkers, usage_rows

LIMIT = 64 * 1024
CHUNK = 16 * 1024


@dataclass
class SpyTokenizer:
    """The real tokenizer, recording which of its methods ran."""

    real: BaseModelTokenizer
    calls: list[str] = field(default_factory=list)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.real, name)
        if not callable(attr):
            return attr

        def spy(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return attr(*args, **kwargs)

        return spy


@pytest.fixture
def limited(make_client: Callable[..., TestClient]) -> TestClient:
    client = make_client(max_request_body_bytes=LIMIT, max_prompt_tokens=16, max_prompt_chars_per_token=4)
    workers = ScriptedWorkers()
    workers.install(client)
    workers.add("w1")
    return client


@pytest.fixture
def tenant(limited: TestClient, new_tenant: Callable[[str], TenantHandle]) -> TenantHandle:
    return new_tenant("acme")


@pytest.fixture
def spy(limited: TestClient) -> SpyTokenizer:
    services = limited.app.state.services  # type: ignore[attr-defined]
    services.tokenizer = SpyTokenizer(services.tokenizer)
    return services.tokenizer


def _oversized_chunks(num_chunks: int = 100) -> list[bytes]:
    head = json.dumps({"model": BASE_MODEL, "prompt": ""})[:-2].encode()  # ... "prompt": "
    return [head] + [b"a" * CHUNK] * num_chunks + [b'"}']


def test_chunked_body_over_the_limit_is_413_after_reading_at_most_the_limit(
    limited: TestClient, tenant: TenantHandle, db_session: Session
) -> None:
    headers = tenant.headers | {"content-type": "application/json"}  # no content-length: chunked
    exchange = run(limited, "/v1/completions", headers, _oversized_chunks())
    assert exchange.status == 413
    error = exchange.json()["error"]
    assert error["type"] == "payload_too_large" and str(LIMIT) in error["message"]
    assert exchange.num_chunks_read <= LIMIT // CHUNK + 2, "the body was read past the limit"
    [row] = usage_rows(db_session, tenant.id)
    assert (row.status, row.prompt_tokens, row.completion_tokens) == ("rejected", 0, 0)


def test_declared_content_length_over_the_limit_is_413_before_any_body_is_read(
    limited: TestClient, tenant: TenantHandle
) -> None:
    chunks = _oversized_chunks()
    headers = tenant.headers | {"content-length": str(sum(map(len, chunks)))}
    exchange = run(limited, "/v1/completions", headers, chunks)
    assert exchange.status == 413 and exchange.num_chunks_read == 0
    over = limited.post("/v1/chat/completions", content=b" " * (LIMIT + 1), headers=tenant.headers)
    assert over.status_code == 413 and "max_request_body_bytes" in over.json()["error"]["message"]


def test_body_at_the_limit_is_served(limited: TestClient, tenant: TenantHandle) -> None:
    body = json.dumps({"model": BASE_MODEL, "prompt": "hi", "max_tokens": 3}).encode()
    padded = body[:-1] + b" " * (LIMIT - len(body)) + b"}"
    response = limited.post("/v1/completions", content=padded, headers=tenant.headers)
    assert response.status_code == 200, response.text


def test_prompt_beyond_the_character_bound_is_a_400_without_tokenizing(
    limited: TestClient, tenant: TenantHandle, spy: SpyTokenizer
) -> None:
    # max_prompt_tokens=16 x max_prompt_chars_per_token=4: at most 64 characters are tokenized
    text = limited.post(
        "/v1/completions", json={"model": BASE_MODEL, "prompt": "word " * 20}, headers=tenant.headers
    )
    chat = limited.post(
        "/v1/chat/completions",
        json={
            "model": BASE_MODEL,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "w" * 65}]}],
        },
        headers=tenant.headers,
    )
    ids = limited.post(
        "/v1/completions", json={"model": BASE_MODEL, "prompt": [5] * 17}, headers=tenant.headers
    )
    for response in (text, chat):
        assert response.status_code == 400
        message = response.json()["error"]["message"]
        assert "64 characters" in message and "shorten" in message
    assert ids.status_code == 400 and "16 tokens" in ids.json()["error"]["message"]
    assert spy.calls == []


def test_prompt_within_the_character_bound_is_tokenized_and_served(
    limited: TestClient, tenant: TenantHandle, spy: SpyTokenizer
) -> None:
    response = limited.post(
        "/v1/completions",
        json={"model": BASE_MODEL, "prompt": "hello world", "max_tokens": 2},
        headers=tenant.headers,
    )
    assert response.status_code == 200, response.text
    assert spy.calls == ["encode"]


@pytest.mark.parametrize("depth", [100, 50_000])
def test_deeply_nested_json_is_a_400(client: TestClient, tenant: TenantHandle, depth: int) -> None:
    nested = "[" * depth + "]" * depth
    body = f'{{"model": "{BASE_MODEL}", "prompt": "hi", "metadata": {nested}}}'
    response = client.post("/v1/completions", content=body, headers=tenant.headers)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request" and "nest" in error["message"]


@pytest.mark.parametrize("seed", [2**64, -1, 10**30])
def test_seed_outside_what_the_engine_accepts_is_a_400_naming_the_range(
    client: TestClient, tenant: TenantHandle, seed: int
) -> None:
    workers = ScriptedWorkers()
    workers.install(client)
    worker = workers.add("w1")
    response = client.post(
        "/v1/completions", json={"model": BASE_MODEL, "prompt": "hi", "seed": seed}, headers=tenant.headers
    )
    assert response.status_code == 400
    assert (
        "seed" in response.json()["error"]["message"]
        and str(2**64 - 1) in response.json()["error"]["message"]
    )
    assert worker.requests == []


def test_largest_seed_is_forwarded(client: TestClient, tenant: TenantHandle) -> None:
    workers = ScriptedWorkers()
    workers.install(client)
    worker = workers.add("w1")
    response = client.post(
        "/v1/completions",
        json={"model": BASE_MODEL, "prompt": "hi", "seed": 2**64 - 1},
        headers=tenant.headers,
    )
    assert response.status_code == 200, response.text
    assert worker.requests[0].sampling.seed == 2**64 - 1


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=2), children, max_size=3)
    ),
    max_leaves=40,
)


@given(value=JSON_VALUES, max_depth=st.integers(min_value=0, max_value=8))
def test_exceeds_depth_matches_the_recursive_definition(value: Any, max_depth: int) -> None:
    assert exceeds_depth(value, max_depth) == (_depth(value) > max_depth)
