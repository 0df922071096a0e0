"""Per-plan rate limits on the inference routes: 429 with Retry-After and the limiter's reason, metered as
rejected; in-memory limiter by default, Redis-backed (shared by replicas) when redis_url is set."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import anyio
import openai
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from api.inference.prepare import admit
from api.ratelimit import InMemoryRateLimiter, RateLimits
from api.redis_ratelimit import RedisRateLimiter
from api.request_charge import ArrivalCharge
from api.services import make_rate_limiter
from settings import Settings
from tests.api.conftest import ADMIN, TenantHandle
from tests.api.test_completions_support import BASE_MODEL, ScriptedWorkers, tokens_events, usage_rows


@pytest.fixture(autouse=True)
def frozen_window(client: TestClient) -> None:
    """One fixed rate-limit window for the whole test (a real clock can cross a minute boundary mid-test)."""
    client.app.state.services.rate_limiter = InMemoryRateLimiter(clock=lambda: 1_000_000.0)  # type: ignore[attr-defined]


def _tenant_on_plan(
    client: TestClient, new_tenant: Callable[[str], TenantHandle], **limits: int
) -> TenantHandle:
    plan = client.post(
        "/v1/admin/plans", json={"name": f"plan-{uuid.uuid4().hex[:6]}", **limits}, headers=ADMIN
    )
    assert plan.status_code == 201, plan.text
    tenant = new_tenant(f"limited-{uuid.uuid4().hex[:6]}")
    patched = client.patch(
        f"/v1/admin/tenants/{tenant.id}", json={"plan_id": plan.json()["id"]}, headers=ADMIN
    )
    assert patched.status_code == 200, patched.text
    return tenant


def _complete(client: TestClient, tenant: TenantHandle, max_tokens: int = 4):  # type: ignore[no-untyped-def]
    return client.post(
        "/v1/completions",
        json={"model": BASE_MODEL, "prompt": "hello", "max_tokens": max_tokens},
        headers=tenant.headers,
    )


def test_requests_per_minute_limit_is_a_429_with_retry_after(
    client: TestClient, new_tenant: Callable[[str], TenantHandle], db_session: Session
) -> None:
    workers = ScriptedWorkers()
    workers.install(client)
    workers.add("w1", events=tokens_events(2))
    tenant = _tenant_on_plan(client, new_tenant, requests_per_min=2)
    unlimited = new_tenant("unlimited")
    assert [_complete(client, tenant).status_code for _ in range(2)] == [200, 200]
    refused = _complete(client, tenant)
    assert refused.status_code == 429
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert refused.json()["error"] == {"type": "rate_limited", "message": refused.json()["error"]["message"]}
    assert "rate limit of 2 requests per minute" in refused.json()["error"]["message"]
    assert _complete(client, unlimited).status_code == 200  # budgets are per tenant
    rows = usage_rows(db_session, tenant.id)
    assert [(r.status, r.completion_tokens) for r in rows] == [("ok", 2), ("ok", 2), ("rejected", 0)]


def test_refused_requests_count_against_requests_per_min_on_arrival(
    client: TestClient, new_tenant: Callable[[str], TenantHandle], db_session: Session
) -> None:
    """Issue 33 item 8: a 400 (bad body) or 404 (unknown model) is charged like an admitted request."""
    ScriptedWorkers().install(client)
    tenant = _tenant_on_plan(client, new_tenant, requests_per_min=5)
    bad = [
        {"model": BASE_MODEL, "prompt": "hi", "n": 0},  # an invalid n: 400
        {"model": BASE_MODEL, "prompt": "hi", "max_tokens": -1},  # invalid value: 400
        {"prompt": "hi"},  # no model: 400
        {"model": "no-such-adapter", "prompt": "hi"},  # unknown model: 404
        {"model": "no-such-adapter@7", "prompt": "hi"},
    ]
    statuses = [client.post("/v1/completions", json=body, headers=tenant.headers).status_code for body in bad]
    assert statuses == [400, 400, 400, 404, 404]
    refused = _complete(client, tenant)  # a valid request: the budget is spent
    assert refused.status_code == 429 and 1 <= int(refused.headers["retry-after"]) <= 60
    assert client.post("/v1/completions", json=bad[0], headers=tenant.headers).status_code == 429
    assert client.post("/v1/chat/completions", content=b"{", headers=tenant.headers).status_code == 429


def test_refused_and_admitted_requests_are_each_charged_once(
    client: TestClient, new_tenant: Callable[[str], TenantHandle]
) -> None:
    ScriptedWorkers().install(client)  # no worker: admitted, then 503
    tenant = _tenant_on_plan(client, new_tenant, requests_per_min=3, tokens_per_min=1000)
    bad = client.post("/v1/completions", json={"prompt": "hi"}, headers=tenant.headers)
    assert [bad.status_code] + [_complete(client, tenant).status_code for _ in range(3)] == [
        400,
        503,
        503,
        429,
    ]


def test_a_request_refused_by_tokens_per_min_still_counts_as_a_request(
    client: TestClient, new_tenant: Callable[[str], TenantHandle]
) -> None:
    ScriptedWorkers().install(client)  # no worker: admitted, then 503
    tenant = _tenant_on_plan(client, new_tenant, requests_per_min=2, tokens_per_min=30)
    too_big = _complete(client, tenant, max_tokens=40)
    assert too_big.status_code == 429 and "tokens per minute" in too_big.json()["error"]["message"]
    assert _complete(client, tenant, max_tokens=4).status_code == 503  # the second request: admitted
    refused = _complete(client, tenant, max_tokens=4)
    assert refused.status_code == 429 and "requests per minute" in refused.json()["error"]["message"]


def test_tokens_per_minute_counts_prompt_plus_max_tokens_at_admission(
    client: TestClient, new_tenant: Callable[[str], TenantHandle], db_session: Session
) -> None:
    workers = ScriptedWorkers()
    workers.install(client)
    workers.add("w1", events=tokens_events(1))
    tenant = _tenant_on_plan(client, new_tenant, tokens_per_min=60)
    assert _complete(client, tenant, max_tokens=40).status_code == 200  # ~1-2 prompt tokens + 40
    refused = _complete(client, tenant, max_tokens=40)
    assert refused.status_code == 429 and "tokens per minute" in refused.json()["error"]["message"]
    assert _complete(client, tenant, max_tokens=5).status_code == 200  # a smaller request still fits
    assert [r.status for r in usage_rows(db_session, tenant.id)] == ["ok", "rejected", "ok"]


def test_openai_client_raises_rate_limit_error(
    client: TestClient, new_tenant: Callable[[str], TenantHandle]
) -> None:
    ScriptedWorkers().install(client)
    tenant = _tenant_on_plan(client, new_tenant, requests_per_min=1)
    oai = openai.OpenAI(
        api_key=tenant.key, base_url="http://testserver/v1", http_client=client, max_retries=0
    )
    with pytest.raises(openai.InternalServerError):  # admitted, but no worker: 503
        oai.completions.create(model=BASE_MODEL, prompt="hi")
    with pytest.raises(openai.RateLimitError) as info:
        oai.completions.create(model=BASE_MODEL, prompt="hi")
    assert info.value.response.headers["retry-after"]


def test_rate_limiter_is_redis_backed_when_redis_is_configured(redis_url: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert isinstance(make_rate_limiter(Settings(data_dir=tmp_path, redis_url=None)), InMemoryRateLimiter)
    prefix = f"test-{uuid.uuid4().hex[:8]}:"
    limiter = make_rate_limiter(Settings(data_dir=tmp_path, redis_url=redis_url, celery_key_prefix=prefix))
    assert isinstance(limiter, RedisRateLimiter)


def test_limits_are_shared_through_redis_across_api_replicas(
    make_client: Callable[..., TestClient], new_tenant: Callable[[str], TenantHandle], redis_url: str
) -> None:
    prefix = f"test-{uuid.uuid4().hex[:8]}:"
    first = make_client(redis_url=redis_url, celery_key_prefix=prefix, is_inline_jobs=True)
    second = make_client(redis_url=redis_url, celery_key_prefix=prefix, is_inline_jobs=True)
    for replica in (first, second):
        ScriptedWorkers().install(replica)
    tenant = _tenant_on_plan(first, new_tenant, requests_per_min=1)
    assert _complete(first, tenant).status_code == 503  # admitted (no worker)
    assert _complete(second, tenant).status_code == 429  # the other replica sees the same budget


def test_max_concurrent_requests_is_a_429_naming_the_limit_and_every_end_releases_the_slot(
    client: TestClient, new_tenant: Callable[[str], TenantHandle], db_session: Session
) -> None:
    workers = ScriptedWorkers()
    workers.install(client)
    workers.add("w1", events=tokens_events(2))
    tenant = _tenant_on_plan(client, new_tenant, max_concurrent_requests=1)
    limiter = client.app.state.services.rate_limiter  # type: ignore[attr-defined]
    assert limiter.acquire_slot(tenant.id, "req-in-flight", 1).is_allowed  # another request of it is running
    refused = _complete(client, tenant)
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert "max_concurrent_requests of 1" in refused.json()["error"]["message"]
    assert _complete(client, new_tenant("uncapped")).status_code == 200  # the cap is per tenant
    limiter.release_slot(tenant.id, "req-in-flight")
    assert [_complete(client, tenant).status_code for _ in range(3)] == [
        200,
        200,
        200,
    ]  # each released its slot
    assert limiter.num_held_slots(tenant.id) == 0
    assert [r.status for r in usage_rows(db_session, tenant.id)] == ["rejected", "ok", "ok", "ok"]


def test_a_request_that_fails_or_is_refused_later_releases_its_slot(
    client: TestClient, new_tenant: Callable[[str], TenantHandle]
) -> None:
    ScriptedWorkers().install(client)  # no worker: admitted, then 503
    tenant = _tenant_on_plan(client, new_tenant, max_concurrent_requests=1, tokens_per_min=30)
    limiter = client.app.state.services.rate_limiter  # type: ignore[attr-defined]
    assert _complete(client, tenant).status_code == 503
    assert limiter.num_held_slots(tenant.id) == 0
    assert _complete(client, tenant, max_tokens=40).status_code == 429  # over tokens/min: no slot kept either
    assert limiter.num_held_slots(tenant.id) == 0


def test_max_concurrent_requests_must_be_positive(client: TestClient) -> None:
    refused = client.post(
        "/v1/admin/plans", json={"name": "zero-cap", "max_concurrent_requests": 0}, headers=ADMIN
    )
    assert refused.status_code in (400, 422) and "max_concurrent_requests" in refused.text


def test_the_api_renews_the_slot_of_a_request_in_flight_with_its_usage_lease(
    make_client: Callable[..., TestClient], new_tenant: Callable[[str], TenantHandle]
) -> None:
    """Slots are leases of usage_lease_timeout_s, renewed by the usage writer of the process holding them."""
    client = make_client(usage_lease_timeout_s=12.0)
    services = client.app.state.services  # type: ignore[attr-defined]
    assert services.rate_limiter.slot_lease_s == 12.0  # from settings, not a constant
    now = [1_000_000.0]
    services.rate_limiter = InMemoryRateLimiter(lambda: now[0], slot_lease_s=12.0)  # read at each renewal
    tenant_id = new_tenant("in-flight").id
    meter = services.usage_ledger.start(tenant_id)
    charge = ArrivalCharge(services.rate_limiter, tenant_id, None)
    anyio.run(admit, services, charge, 1, RateLimits(max_concurrent_requests=1), meter)
    services.usage_ledger.open(meter, is_checkpointed=False)
    for _ in range(4):  # 24 s: two leases
        now[0] += 6.0
        assert services.usage_ledger.writer.renew_slots() == 1
    assert services.rate_limiter.num_held_slots(tenant_id) == 1
    anyio.run(services.usage_ledger.record, meter, "ok")
    assert services.rate_limiter.num_held_slots(tenant_id) == 0
