"""`n` choices over HTTP with scripted workers (api/inference/choices.py): response shapes streamed and not,
one worker for every choice, derived seeds, metering (prompt once, completions summed), best_of, and the
plan's caps on n and top_logprobs (api/plan_limits.py). The real engine's side (prefix-cache hits of the
siblings, reproducibility, a client leaving mid-stream) is in test_completions_n_engine.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import httpx
import openai
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from api.inference.choices import choice_seed
from cluster.protocol import GenerateRequest
from tests.api.conftest import ADMIN, TenantHandle
from tests.api.test_completions_support import (
    BASE_MODEL,
    ScriptedWorkers,
    complete,
    delta,
    events_response,
    final,
    sse_events,
    tokens_events,
    usage_rows,
)

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hi"}]


def on_plan(client: TestClient, new_tenant: Callable[[str], TenantHandle], **plan: int) -> TenantHandle:
    """A new tenant on a new plan with these fields."""
    created = client.post(
        "/v1/admin/plans", json={"name": f"p-{uuid.uuid4().hex[:6]}", **plan}, headers=ADMIN
    )
    assert created.status_code == 201, created.text
    tenant = new_tenant(f"t-{uuid.uuid4().hex[:6]}")
    patched = client.patch(
        f"/v1/admin/tenants/{tenant.id}", json={"plan_id": created.json()["id"]}, headers=ADMIN
    )
    assert patched.status_code == 200, patched.text
    return tenant


def test_n_completions_return_n_indexed_choices_billing_the_prompt_once_and_every_completion(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle, db_session: Session
) -> None:
    worker = workers.add("w1", events=tokens_events(3))
    response = complete(client, tenant, n=3, max_tokens=3, seed=11)
    assert response.status_code == 200, response.text
    body = response.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [c["text"] for c in body["choices"]] == ["t0 t1 t2 "] * 3
    assert [c["finish_reason"] for c in body["choices"]] == ["length"] * 3
    [row] = usage_rows(db_session, tenant.id)
    assert (row.status, row.completion_tokens) == ("ok", 9)
    assert body["usage"] == {
        "prompt_tokens": row.prompt_tokens,
        "completion_tokens": 9,
        "total_tokens": row.prompt_tokens + 9,
    }
    assert row.prompt_tokens == len(worker.requests[0].prompt_token_ids or [])  # once, not 3 times
    ids = [r.request_id for r in worker.requests]
    assert ids == [row.request_id, f"{row.request_id}.1", f"{row.request_id}.2"]


def test_every_choice_goes_to_the_worker_the_first_was_routed_to(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle
) -> None:
    first, second = workers.add("w1"), workers.add("w2")
    for _ in range(4):
        assert complete(client, tenant, n=3, max_tokens=3).status_code == 200
    counts = sorted([len(first.requests), len(second.requests)])
    assert sum(counts) == 12 and all(c % 3 == 0 for c in counts)
    for worker in (first, second):  # the siblings of each request right after their first choice
        ids = [r.request_id for r in worker.requests]
        assert all(ids[i + 1] == f"{ids[i]}.1" and ids[i + 2] == f"{ids[i]}.2" for i in range(0, len(ids), 3))


def test_choices_get_distinct_derived_seeds_and_the_same_seed_gives_the_same_ones(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle
) -> None:
    worker = workers.add("w1")
    assert complete(client, tenant, n=3, seed=42).status_code == 200
    assert complete(client, tenant, n=3, seed=42).status_code == 200
    assert complete(client, tenant, n=2).status_code == 200
    seeds = [r.sampling.seed for r in worker.requests]
    assert seeds[:3] == seeds[3:6] == [42, choice_seed(42, 1), choice_seed(42, 2)]
    assert len(set(seeds[:3])) == 3
    assert seeds[6:] == [None, None]  # unseeded: every choice samples on its own
    assert complete(client, tenant, seed=42).status_code == 200  # n=1 keeps the seed as sent
    assert worker.requests[-1].sampling.seed == 42


def test_choice_seeds_stay_in_range_and_differ() -> None:
    seeds = {choice_seed(2**64 - 1, i) for i in range(128)} | {choice_seed(0, i) for i in range(128)}
    assert len(seeds) == 256 and all(0 <= s <= 2**64 - 1 for s in seeds if s is not None)


def test_streamed_chat_with_n_via_the_openai_client(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle, db_session: Session
) -> None:
    workers.add("w1", events=tokens_events(2))
    oai = openai.OpenAI(
        api_key=tenant.key, base_url="http://testserver/v1", http_client=client, max_retries=0
    )
    chunks = list(
        oai.chat.completions.create(
            model=BASE_MODEL,
            messages=MESSAGES,
            n=2,
            max_tokens=2,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts: dict[int, str] = {}
    roles: dict[int, int] = {}
    finishes: dict[int, str | None] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            roles[choice.index] = roles.get(choice.index, 0) + (choice.delta.role == "assistant")
            if choice.finish_reason is not None:
                finishes[choice.index] = choice.finish_reason
    assert texts == {0: "t0 t1 ", 1: "t0 t1 "} and roles == {0: 1, 1: 1}
    assert finishes == {0: "length", 1: "length"}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    [row] = usage_rows(db_session, tenant.id)
    assert (row.status, row.completion_tokens, row.prompt_tokens) == ("ok", 4, chunks[-1].usage.prompt_tokens)
    plain = oai.chat.completions.create(model=BASE_MODEL, messages=MESSAGES, n=3, max_tokens=2)
    assert [c.index for c in plain.choices] == [0, 1, 2] and plain.usage is not None
    assert plain.usage.completion_tokens == 6


def test_streamed_completion_chunks_carry_their_choice_index(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle
) -> None:
    workers.add("w1", events=tokens_events(2))
    response = complete(client, tenant, n=3, max_tokens=2, stream=True)
    chunks = [e for e in sse_events(response.text) if e != "[DONE]"]
    by_index: dict[int, list[str | None]] = {}
    for chunk in chunks:
        [choice] = chunk["choices"]
        by_index.setdefault(choice["index"], []).append(choice["finish_reason"])
    assert by_index == {i: [None, None, "length"] for i in range(3)}


def test_a_failing_choice_fails_the_request_and_bills_what_was_delivered(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle, db_session: Session
) -> None:
    broken = [delta("a", 1), {"type": "error", "code": "internal", "message": "boom"}]
    workers.add("w1", events=broken)
    assert complete(client, tenant, n=2).status_code == 502
    streamed = complete(client, tenant, n=2, stream=True)
    assert "worker_error" in streamed.text and streamed.text.endswith("data: [DONE]\n\n")
    plain, stream = usage_rows(db_session, tenant.id)
    assert (plain.status, plain.completion_tokens) == ("error", 0)  # nothing reached the client
    assert stream.status == "error" and 1 <= stream.completion_tokens <= 2  # the tokens sent before it broke


@pytest.mark.parametrize(("n", "expected"), [(0, "n"), (-1, "n"), (9, "max_n of 8")])
def test_n_out_of_range_or_above_the_default_plan_cap_is_a_400_naming_it(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
    n: int,
    expected: str,
) -> None:
    worker = workers.add("w1")
    response = complete(client, tenant, n=n)
    assert response.status_code == 400 and expected in response.json()["error"]["message"]
    assert worker.requests == []
    [row] = usage_rows(db_session, tenant.id)
    assert (row.status, row.prompt_tokens, row.completion_tokens) == ("rejected", 0, 0)
    assert complete(client, tenant, n=8, max_tokens=1).status_code == 200


def test_a_plan_s_max_n_and_max_top_logprobs_cap_requests_with_a_400_naming_them(
    client: TestClient, workers: ScriptedWorkers, new_tenant: Callable[[str], TenantHandle]
) -> None:
    workers.add("w1")
    capped = on_plan(client, new_tenant, max_n=2, max_top_logprobs=3)
    assert complete(client, capped, n=2).status_code == 200
    over = complete(client, capped, n=3)
    assert over.status_code == 400 and "max_n of 2" in over.json()["error"]["message"]
    chat = complete(client, capped, CHAT, messages=MESSAGES, prompt=None, logprobs=True, top_logprobs=4)
    assert (
        chat.status_code == 400 and "top_logprobs=4 is above your plan's max_top_logprobs of 3" in chat.text
    )
    text = complete(client, capped, logprobs=4)
    assert text.status_code == 400 and "logprobs=4 is above your plan's max_top_logprobs of 3" in text.text
    roomy = on_plan(client, new_tenant, max_n=16)
    assert complete(client, roomy, n=16, max_tokens=1).status_code == 200


@pytest.mark.parametrize(
    ("plan", "field"),
    [({"max_n": 0}, "max_n"), ({"max_n": 129}, "max_n"), ({"max_top_logprobs": 21}, "max_top_logprobs")],
)
def test_a_plan_cap_out_of_range_is_a_422_naming_it(
    client: TestClient, plan: dict[str, int], field: str
) -> None:
    response = client.post("/v1/admin/plans", json={"name": "bad", **plan}, headers=ADMIN)
    assert response.status_code == 422 and field in response.json()["error"]["message"]


def test_plans_show_their_caps_null_meaning_the_default(client: TestClient) -> None:
    made = client.post(
        "/v1/admin/plans", json={"name": "c", "max_n": 4, "max_top_logprobs": 0}, headers=ADMIN
    )
    default = client.post("/v1/admin/plans", json={"name": "d"}, headers=ADMIN)
    assert (made.json()["max_n"], made.json()["max_top_logprobs"]) == (4, 0)
    assert (default.json()["max_n"], default.json()["max_top_logprobs"]) == (None, None)


@pytest.mark.parametrize(
    ("best_of", "n", "stream", "status", "says"),
    [
        (2, 2, True, 200, ""),
        (1, 1, False, 200, ""),
        (3, 2, False, 200, ""),
        (3, 2, True, 400, "best_of=3 > n=2 cannot be streamed"),
        (1, 2, False, 400, "must be >= n"),
        (9, 1, False, 400, "best_of=9 is above your plan's max_n of 8"),
    ],
)
def test_best_of_below_n_streamed_above_n_or_above_the_plan_s_max_n_is_a_400(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    best_of: int,
    n: int,
    stream: bool,
    status: int,
    says: str,
) -> None:
    workers.add("w1")
    response = complete(client, tenant, n=n, best_of=best_of, stream=stream)
    assert response.status_code == status and says in response.text


def final_with(num_tokens: int, cumulative_logprob: float) -> list[dict[str, object]]:
    """num_tokens deltas "<cumulative>:i " then a final reporting the cumulative logprob."""
    tag = f"{cumulative_logprob:g}"
    deltas = [delta(f"{tag}:{i} ", 10 + i) for i in range(num_tokens)]
    return deltas + [final(0, num_tokens) | {"cumulative_logprob": cumulative_logprob}]


# mean logprob per token: -1.5, -0.5 (the best), -0.9 (the highest sum, not the highest mean), -0.75
SEQUENCES = [final_with(2, -3.0), final_with(4, -2.0), final_with(1, -0.9), final_with(4, -3.0)]


@pytest.mark.parametrize(
    ("n", "expected"), [(1, ["-2:0 -2:1 -2:2 -2:3 "]), (2, ["-2:0 -2:1 -2:2 -2:3 ", "-3:0 -3:1 -3:2 -3:3 "])]
)
def test_best_of_returns_the_n_highest_mean_logprobs_best_first_and_bills_every_sequence(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
    n: int,
    expected: list[str],
) -> None:
    async def answer(request: GenerateRequest) -> httpx.Response:
        index = int(request.request_id.rpartition(".")[2]) if "." in request.request_id else 0
        return events_response(SEQUENCES[index])

    worker = workers.add("w1", answer=answer)
    response = complete(client, tenant, n=n, best_of=4, max_tokens=4, seed=3)
    assert response.status_code == 200, response.text
    body = response.json()
    assert [c["index"] for c in body["choices"]] == list(range(n))
    assert [c["text"] for c in body["choices"]] == expected
    [row] = usage_rows(db_session, tenant.id)
    assert (row.status, row.completion_tokens) == ("ok", 11)  # 2 + 4 + 1 + 4: every sequence
    assert row.prompt_tokens == len(worker.requests[0].prompt_token_ids or [])  # the prompt once
    assert body["usage"]["completion_tokens"] == 11
    assert [r.sampling.seed for r in worker.requests] == [choice_seed(3, i) for i in range(4)]
    assert all(r.sampling.needs_cumulative_logprob for r in worker.requests)


def test_a_request_without_best_of_above_n_does_not_ask_for_cumulative_logprobs(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle
) -> None:
    worker = workers.add("w1")
    assert complete(client, tenant, n=2, best_of=2).status_code == 200
    assert complete(client, tenant, logprobs=1).status_code == 200
    assert not any(r.sampling.needs_cumulative_logprob for r in worker.requests)


def test_tokens_per_min_is_charged_the_prompt_once_and_n_times_max_tokens_upfront(
    client: TestClient,
    workers: ScriptedWorkers,
    new_tenant: Callable[[str], TenantHandle],
    db_session: Session,
) -> None:
    worker = workers.add("w1")
    probe = new_tenant("probe")
    assert complete(client, probe, max_tokens=10).status_code == 200
    num_prompt = len(worker.requests[0].prompt_token_ids or [])
    tenant = on_plan(client, new_tenant, tokens_per_min=num_prompt + 3 * 10)
    refused = complete(client, tenant, n=4, max_tokens=10)  # prompt + 40 > the budget
    assert refused.status_code == 429 and "tokens" in refused.json()["error"]["message"]
    assert complete(client, tenant, n=3, max_tokens=10).status_code == 200  # prompt + 30: exactly the budget
    assert complete(client, tenant, n=1, max_tokens=1).status_code == 429  # spent by the n=3 request


@pytest.mark.parametrize(
    ("status", "error_type", "expected"), [(400, "bad_request", 400), (503, "draining", 503)]
)
def test_a_sibling_the_worker_refuses_fails_the_request_with_the_worker_s_status(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
    monkeypatch: pytest.MonkeyPatch,
    status: int,
    error_type: str,
    expected: int,
) -> None:
    worker = workers.add("w1", events=tokens_events(3))
    handle = workers._handle

    async def refuse_choice_1(request: httpx.Request) -> httpx.Response:
        if GenerateRequest.model_validate_json(request.content).request_id.endswith(".1"):
            worker.requests.append(GenerateRequest.model_validate_json(request.content))
            return httpx.Response(status, json={"error": {"type": error_type, "message": "scripted"}})
        return await handle(request)

    monkeypatch.setattr(workers, "_handle", refuse_choice_1)
    workers.install(client)
    response = complete(client, tenant, n=3)
    assert response.status_code == expected, response.text
    assert len(worker.requests) == 3  # choice 0, then choices 1 and 2 on the same worker
    [row] = usage_rows(db_session, tenant.id)
    assert row.status == "error" and row.completion_tokens == 0
