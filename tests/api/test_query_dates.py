"""Date query parameters of /v1/usage and the admin reports: dates at the ends of Python's calendar are a
400 naming the parameter and the accepted range, never a 500."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from api.query_dates import EARLIEST_MOMENT, LATEST_MOMENT
from tests.api.conftest import ADMIN, TenantHandle

# Each overflowed on main: converting to UTC, or subtracting the predictor's window.
EDGE_PARAMS = [
    ("start", "0001-01-01T00:00:00+01:00"),
    ("end", "9999-12-31T23:59:59-01:00"),
    ("end", "0001-01-01"),
    ("start", "9999-12-31T23:59:59"),
]
ADMIN_ROUTES = ["/v1/admin/billing", "/v1/admin/slo", "/v1/admin/predictor"]


def _assert_out_of_range(response, name: str) -> None:  # type: ignore[no-untyped-def]
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert f"{name}=" in message and "out of range" in message
    assert EARLIEST_MOMENT.isoformat() in message and LATEST_MOMENT.isoformat() in message


@pytest.mark.parametrize(("name", "value"), EDGE_PARAMS)
def test_usage_refuses_dates_outside_the_range_with_400(
    client: TestClient, tenant: TenantHandle, name: str, value: str
) -> None:
    _assert_out_of_range(client.get("/v1/usage", params={name: value}, headers=tenant.headers), name)


ADMIN_CASES = [
    (route, name, value)
    for route in ADMIN_ROUTES
    for name, value in EDGE_PARAMS
    if name == "end" or not route.endswith("predictor")  # the predictor report takes end and window_s only
]


@pytest.mark.parametrize(("route", "name", "value"), ADMIN_CASES)
def test_admin_reports_refuse_dates_outside_the_range_with_400(
    client: TestClient, route: str, name: str, value: str
) -> None:
    _assert_out_of_range(client.get(route, params={name: value}, headers=ADMIN), name)


def test_the_ends_of_the_range_are_accepted(client: TestClient, tenant: TenantHandle) -> None:
    period = {"start": EARLIEST_MOMENT.isoformat(), "end": LATEST_MOMENT.isoformat()}
    usage = client.get("/v1/usage", params=period, headers=tenant.headers)
    assert usage.status_code == 200, usage.text
    assert (usage.json()["start"], usage.json()["end"]) == (period["start"], period["end"])
    for route in ADMIN_ROUTES[:2]:
        assert client.get(route, params=period, headers=ADMIN).status_code == 200
    predictor = client.get("/v1/admin/predictor", params={"end": EARLIEST_MOMENT.isoformat()}, headers=ADMIN)
    assert predictor.status_code == 200, predictor.text
