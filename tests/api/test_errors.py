"""Every error, FastAPI's own included, has the shape {"error": {"type", "message"}}."""

from __future__ import annotations

import pytest

from api.errors import validation_error_status
from tests.api.conftest import ADMIN


def test_unknown_route_is_json_404(client) -> None:
    response = client.get("/v1/nope")
    assert response.status_code == 404
    assert response.json() == {"error": {"type": "not_found", "message": "Not Found"}}


def test_wrong_method_is_json_405(client) -> None:
    response = client.put("/v1/models")
    assert response.status_code == 405 and response.json()["error"]["type"] == "method_not_allowed"


def test_invalid_body_is_json_422_naming_the_field(client) -> None:
    response = client.post("/v1/admin/tenants", json={"name": 5}, headers=ADMIN)
    assert response.status_code == 422
    assert (
        response.json()["error"]["type"] == "invalid_request"
        and "name" in response.json()["error"]["message"]
    )


def test_health_reports_ok(client) -> None:
    assert client.get("/v1/health").json() == {"status": "ok"}


@pytest.mark.parametrize(
    ("code", "status"),
    [("weights_too_large", 413), ("archive_too_large", 413), ("too_many_archive_members", 413),
     ("rank_too_large", 422), ("pickle_not_allowed", 400), ("unsafe_archive_path", 400), ("non_finite_values", 422)],
)  # fmt: skip
def test_validator_codes_map_to_http_statuses(code: str, status: int) -> None:
    assert validation_error_status(code) == status
