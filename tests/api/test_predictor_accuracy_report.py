"""The operator's accuracy report of the learned length predictor: exact per adapter and overall, admin only."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from tests.api.conftest import ADMIN, TenantHandle
from tests.api.test_completions_support import (
    add_ready_version,
)
from tests.registry.predictor_rows import T0, RowSpec, insert_rows

LOGGER = "api.inference.learned_predictor"


def test_the_admin_report_has_exact_per_adapter_and_overall_accuracy_of_recorded_predictions(
    client: TestClient, tenant: TenantHandle, db_session: Session
) -> None:
    a, b = (add_ready_version(db_session, tenant.id, name) for name in ("a", "b"))
    insert_rows(
        db_session,
        tenant.id,
        [
            RowSpec(a.id, 20, predicted=10),  # |err| 10, buckets 0/0: hit
            RowSpec(a.id, 35, predicted=40),  # 5, 1/1: hit
            RowSpec(a.id, 100, predicted=100),  # 0, hit
            RowSpec(b.id, 300, predicted=600),  # 300, 5/4: miss
            RowSpec(b.id, 2, predicted=1),  # 1, hit
            RowSpec(b.id, 5, predicted=500, status="aborted"),  # not finished: left out
            RowSpec(b.id, 5, predicted=None),  # no prediction: left out
        ],
    )
    insert_rows(db_session, tenant.id, [RowSpec(a.id, 1, predicted=900)], start=T0 - timedelta(hours=3))
    response = client.get(
        "/v1/admin/predictor",
        params={"end": (T0 + timedelta(hours=1)).isoformat(), "window_s": 7200},
        headers=ADMIN,
    )
    assert response.status_code == 200, response.text
    report = response.json()
    assert {k: report["overall"][k] for k in ("num_samples", "mae", "bucket_accuracy")} == {
        "num_samples": 5,
        "mae": 316 / 5,
        "bucket_accuracy": 4 / 5,
    }
    by_version = {g["adapter_version_id"]: g for g in report["data"]}
    assert {k: by_version[a.id][k] for k in ("num_samples", "mae", "bucket_accuracy")} == {
        "num_samples": 3,
        "mae": 5.0,
        "bucket_accuracy": 1.0,
    }
    assert {k: by_version[b.id][k] for k in ("num_samples", "mae", "bucket_accuracy")} == {
        "num_samples": 2,
        "mae": 150.5,
        "bucket_accuracy": 0.5,
    }
    assert by_version[a.id]["adapter_id"] == a.adapter_id
    assert report["model"] == {
        "kind": "learned",
        "version": "prior",
        "trained_at": None,
        "num_samples": None,
        "num_training_samples": None,
        "num_heldout_samples": None,
        "heldout": None,
        "heldout_per_adapter": [],
    }
    assert report["bucket_edges"] == [32, 64, 128, 256, 512, 1024]


def test_the_admin_report_needs_the_admin_key_and_a_sane_window(
    client: TestClient, tenant: TenantHandle
) -> None:
    assert client.get("/v1/admin/predictor").status_code == 401
    assert client.get("/v1/admin/predictor", headers=tenant.headers).status_code == 401
    assert client.get("/v1/admin/predictor", params={"window_s": 0}, headers=ADMIN).status_code == 400
    assert client.get("/v1/admin/predictor", params={"end": "soon"}, headers=ADMIN).status_code == 400
    empty = client.get("/v1/admin/predictor", params={"end": "2001-01-01"}, headers=ADMIN).json()
    assert empty["overall"] == {
        "num_samples": 0,
        "mae": None,
        "bucket_accuracy": None,
        "spearman": None,
        "bucket_recall": [],
        "bucket_num_samples": [0] * 7,
    }
    assert empty["data"] == []


def test_the_admin_report_has_rank_correlation_and_per_bucket_recall_by_hand(
    client: TestClient, tenant: TenantHandle, db_session: Session
) -> None:
    a, b = (add_ready_version(db_session, tenant.id, name) for name in ("a", "b"))
    insert_rows(
        db_session,
        tenant.id,
        [  # (predicted, true) with buckets of edges 32, 64, 128, 256, 512, 1024
            RowSpec(a.id, 20, predicted=10),  # true bucket 0, predicted 0: hit
            RowSpec(a.id, 5, predicted=50),  # 0 / 1
            RowSpec(a.id, 40, predicted=200),  # 1 / 3
            RowSpec(a.id, 300, predicted=30),  # 4 / 0
            RowSpec(b.id, 100, predicted=100),  # 2 / 2: hit
            RowSpec(b.id, 50, predicted=100),  # 1 / 2
            RowSpec(b.id, 50, predicted=5),  # 1 / 0
        ],
    )
    response = client.get(
        "/v1/admin/predictor",
        params={"end": (T0 + timedelta(hours=1)).isoformat(), "window_s": 7200},
        headers=ADMIN,
    )
    assert response.status_code == 200, response.text
    report = response.json()
    overall = report["overall"]
    # ranks [2, 4, 7, 3, 5.5, 5.5, 1] vs [2, 1, 3, 7, 6, 4.5, 4.5]: 0.25 / sqrt(27.5 * 27.5)
    assert overall["spearman"] == pytest.approx(1 / 110)
    assert overall["bucket_recall"] == [0.5, 0.0, 1.0, None, 0.0, None, None]
    assert overall["bucket_num_samples"] == [2, 3, 1, 0, 1, 0, 0]
    assert overall["bucket_accuracy"] == pytest.approx(2 / 7)
    by_version = {g["adapter_version_id"]: g for g in report["data"]}
    # a: ranks [1, 3, 4, 2] vs [2, 1, 3, 4]: sum d^2 = 10, 1 - 6 * 10 / (4 * 15) = 0
    assert by_version[a.id]["spearman"] == pytest.approx(0.0, abs=1e-9)
    assert by_version[a.id]["bucket_recall"] == [0.5, 0.0, None, None, 0.0, None, None]
    # b, with ties: ranks [2.5, 2.5, 1] vs [3, 1.5, 1.5]: 0.75 / sqrt(1.5 * 1.5)
    assert by_version[b.id]["spearman"] == pytest.approx(0.5)
    assert by_version[b.id]["bucket_recall"] == [None, 0.0, 1.0, None, None, None, None]
    assert by_version[b.id]["bucket_num_samples"] == [0, 2, 1, 0, 0, 0, 0]


def test_the_admin_report_names_the_max_tokens_policy(make_client: Callable[..., TestClient]) -> None:
    report = make_client(length_predictor="max_tokens").get("/v1/admin/predictor", headers=ADMIN).json()
    assert (report["model"]["kind"], report["model"]["version"]) == ("max_tokens", "max_tokens")


# ---- timers -----------------------------------------------------------------------------------------------
