"""GET /v1/usage: a tenant sees its own usage per day and model, nobody else's."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from registry import api_keys
from tests.registry.test_usage_db import seed_ledger

PERIOD = {"start": "2026-01-01", "end": "2026-01-03"}


def _key(session: Session, tenant_id: str) -> dict[str, str]:
    _, key = api_keys.create_api_key(session, tenant_id)
    session.commit()
    return {"Authorization": f"Bearer {key}"}


def test_usage_lists_own_rows_by_day_and_model(client: TestClient, db_session: Session) -> None:
    seeded = seed_ledger(db_session)
    response = client.get("/v1/usage", params=PERIOD, headers=_key(db_session, seeded.gold_tenant_id))
    assert response.status_code == 200, response.text
    body = response.json()
    [day] = body["data"]
    assert (day["day"], day["model"], day["num_requests"]) == ("2026-01-01", "writer", 5)
    assert (day["prompt_tokens"], day["completion_tokens"]) == (1600, 570)
    assert day["by_status"] == {"ok": 2, "error": 1, "aborted": 1, "rejected": 1}
    assert (body["total_prompt_tokens"], body["total_completion_tokens"]) == (1600, 570)


def test_usage_never_shows_other_tenants(client: TestClient, db_session: Session) -> None:
    seeded = seed_ledger(db_session)
    body = client.get("/v1/usage", params=PERIOD, headers=_key(db_session, seeded.free_tenant_id)).json()
    assert [(d["model"], d["prompt_tokens"]) for d in body["data"]] == [("lorahost-base", 10)]


def test_usage_defaults_to_the_last_30_days_and_refuses_bad_dates(
    client: TestClient, db_session: Session
) -> None:
    seeded = seed_ledger(db_session)
    headers = _key(db_session, seeded.gold_tenant_id)
    assert client.get("/v1/usage", headers=headers).json()["data"] == []  # the seeded ledger is in 2026-01
    bad = client.get("/v1/usage", params={"start": "01/02/2026"}, headers=headers)
    assert bad.status_code == 400 and "ISO 8601" in bad.json()["error"]["message"]
    assert client.get("/v1/usage").status_code == 401
