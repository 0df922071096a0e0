"""The learned output-length predictor on the API: features recorded with usage, true lengths fed back, the
trained model hot-reloaded from the blob store (and the prior kept when an artifact is missing or corrupt),
GET /v1/admin/predictor, and the timers that reload and train."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from api.inference.learned_predictor import LearnedLengthPredictor
from api.inference.predict import MaxTokensPredictor, PredictionInput
from api.main import _start_predictor_reload, _start_predictor_training
from registry.predictor_artifacts import POINTER_KEY, read_pointer, write_predictor
from registry.predictor_training import run_predictor_training
from registry.storage import LocalBlobStore
from scheduler.length.length_predictor import LengthPredictor, LengthSample, RequestFeatures
from settings import Settings
from tests.api.conftest import ADMIN, TenantHandle, num_timer_threads
from tests.api.test_completions_support import (
    BASE_MODEL,
    ScriptedWorkers,
    add_ready_version,
    tokens_events,
    usage_rows,
)
from tests.polling import wait_for
from tests.registry.predictor_rows import MAX_TOKENS, MEDIANS, T0, distinct_specs, insert_rows

LOGGER = "api.inference.learned_predictor"


def _services(client: TestClient):  # type: ignore[no-untyped-def]
    return client.app.state.services  # type: ignore[attr-defined]


def _complete(client: TestClient, tenant: TenantHandle, **body: object):  # type: ignore[no-untyped-def]
    return client.post(
        "/v1/completions", json={"model": BASE_MODEL, "prompt": "hi", **body}, headers=tenant.headers
    )


def _input(adapter_key: str | None, max_tokens: int = MAX_TOKENS) -> PredictionInput:
    return PredictionInput("t", adapter_key, 100, max_tokens)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


# ---- features and true lengths, through the API ------------------------------------------------------------


def test_the_learned_predictor_is_the_default_and_max_tokens_stays_selectable(
    make_client: Callable[..., TestClient],
) -> None:
    assert isinstance(_services(make_client()).predictor, LearnedLengthPredictor)
    assert isinstance(_services(make_client(length_predictor="max_tokens")).predictor, MaxTokensPredictor)


def test_a_request_records_its_prediction_and_features_in_its_usage_row(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle, db_session: Session
) -> None:
    workers.add("w1", events=tokens_events(2))
    prompt = "Write a very long story about the cats of Rome"
    assert _complete(client, tenant, prompt=prompt, max_tokens=7, stop=["\n\n"]).status_code == 200
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say yes or no"}]
    chat = client.post(
        "/v1/chat/completions",
        json={"model": BASE_MODEL, "messages": messages, "max_tokens": 9},
        headers=tenant.headers,
    )
    assert chat.status_code == 200, chat.text
    completion_row, chat_row = usage_rows(db_session, tenant.id)
    assert (completion_row.max_tokens, completion_row.is_chat, completion_row.has_stop) == (7, False, True)
    assert completion_row.predicted_output_tokens == 7  # the prior: no history for the base model yet
    assert (chat_row.max_tokens, chat_row.is_chat, chat_row.has_stop) == (9, True, False)
    assert (
        completion_row.prompt_features is None and chat_row.prompt_features is None
    )  # nothing of the content


def test_finished_requests_feed_their_true_length_to_the_adapters_history(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle, db_session: Session
) -> None:
    worker = workers.add("w1", events=tokens_events(3, finish_reason="stop"))
    assert _complete(client, tenant, max_tokens=50).status_code == 200
    assert _complete(client, tenant, max_tokens=50, n=0).status_code == 400  # rejected: no length to learn
    history = _services(client).predictor.history(tenant.id, None)
    assert history is not None and history.to_state()[0] == [3]
    assert _complete(client, tenant, max_tokens=50).status_code == 200
    assert [r.predicted_output_tokens for r in worker.requests] == [50, 3]  # the prior: the history median
    assert [r.predicted_output_tokens for r in usage_rows(db_session, tenant.id)] == [50, None, 3]


# ---- isolation (issue 19): no tenant moves another's predictions; nothing of a prompt's content is stored -------

# per request, whatever the content: ids, clock readings and latencies
PER_REQUEST_COLUMNS = frozenset(
    {
        "id",
        "request_id",
        "started_at",
        "finished_at",
        "checkpointed_at",
        "lease_renewed_at",
        "ttft_ms",
        "tpot_ms",
        "e2e_ms",
    }
)


def test_one_tenants_traffic_leaves_another_tenants_predictions_on_shared_models_unchanged(
    client: TestClient,
    workers: ScriptedWorkers,
    new_tenant: Callable[[str], TenantHandle],
    db_session: Session,
) -> None:
    """A's long outputs on the base model and on a public adapter: B's predictions stay what they were without
    A's traffic (on main one shared history per adapter moved them from 1 to 300 tokens)."""
    owner, tenant_a, tenant_b = new_tenant("owner"), new_tenant("tenant-a"), new_tenant("tenant-b")
    add_ready_version(db_session, owner.id, "shared", visibility="public")
    worker = workers.add("w1", events=tokens_events(1, finish_reason="stop"))
    models = (BASE_MODEL, "shared")

    def predictions(tenant: TenantHandle) -> list[int | None]:
        first = len(worker.requests)
        for model in models:
            assert _complete(client, tenant, model=model, max_tokens=400).status_code == 200
        return [r.predicted_output_tokens for r in worker.requests[first:]]

    predictions(tenant_b)  # B's short outputs are now in B's histories
    alone = predictions(tenant_b)
    assert alone == [1, 1]
    worker.events = tokens_events(300)
    for _ in range(10):
        a_predictions = predictions(tenant_a)
    assert a_predictions == [300, 300]  # A's own history did move
    worker.events = tokens_events(1, finish_reason="stop")
    assert predictions(tenant_b) == alone


def test_stored_features_of_prompts_of_one_size_are_identical_whatever_they_say(
    client: TestClient, workers: ScriptedWorkers, tenant: TenantHandle, db_session: Session
) -> None:
    """Three prompts of the same token count, different digits and word counts (4, 4, 5): their usage rows
    are identical but for per-request ids, clocks and latencies, so neither the content nor the exact word
    count can be narrowed down from what is stored (on main, a hashed n-gram histogram told them apart)."""
    workers.add("w1", events=tokens_events(2))
    prompts = ["hello", "my PIN is 1234", "my PIN is 9876", "my PIN is 12 34"]  # the first fills the history
    for prompt in prompts:
        assert _complete(client, tenant, prompt=prompt, max_tokens=8).status_code == 200
    rows = usage_rows(db_session, tenant.id)[1:]
    stored = [
        {c.name: getattr(r, c.name) for c in r.__table__.columns if c.name not in PER_REQUEST_COLUMNS}
        for r in rows
    ]
    assert len({r["prompt_tokens"] for r in stored}) == 1  # the same coarse size (metered: billed by it)
    assert stored[0] == stored[1] == stored[2]


# ---- the trained model, hot-reloaded -------------------------------------------------------------------------


def test_a_trained_model_is_reloaded_and_predicts_each_adapter_closer_than_max_tokens(
    client: TestClient,
    workers: ScriptedWorkers,
    tenant: TenantHandle,
    db_session: Session,
    db_session_factory: sessionmaker[Session],
    blob_store: LocalBlobStore,
    tmp_path: Path,
) -> None:
    versions = {name: add_ready_version(db_session, tenant.id, name) for name in sorted(MEDIANS)}
    insert_rows(db_session, tenant.id, distinct_specs(versions, 250))
    settings = Settings(data_dir=tmp_path, predictor_min_training_samples=100)
    run = run_predictor_training(db_session_factory, blob_store, settings, now=T0 + timedelta(days=1))
    assert run is not None
    predictor = _services(client).predictor
    assert predictor.model_version is None
    assert predictor.reload() is True
    assert predictor.model_version == run.pointer.version
    assert predictor.reload() is False  # same version: nothing to load

    worker = workers.add("w1", events=tokens_events(2))
    for name in sorted(MEDIANS):
        response = _complete(client, tenant, model=name, max_tokens=MAX_TOKENS)
        assert response.status_code == 200, response.text
    predictions = {name: r.predicted_output_tokens for name, r in zip(sorted(MEDIANS), worker.requests)}
    for name, median in MEDIANS.items():
        assert abs(predictions[name] - median) < 0.3 * median, predictions
        assert abs(predictions[name] - median) < abs(MAX_TOKENS - median) / 3  # max_tokens: the prior here
    ours = usage_rows(db_session, tenant.id)[:2]  # the hand-made rows start later, at T0
    assert [r.predicted_output_tokens for r in ours] == [predictions[name] for name in sorted(MEDIANS)]

    report = client.get("/v1/admin/predictor", headers=ADMIN).json()
    assert report["model"]["kind"] == "learned"
    assert report["model"]["version"] == run.pointer.version
    assert report["model"]["num_samples"] == 250 and report["model"]["num_heldout_samples"] == 50
    assert report["model"]["heldout"] == run.metadata["heldout"]["overall"]
    assert len(report["model"]["heldout_per_adapter"]) == 2


def _fitted_artifact(version: str) -> bytes:
    samples = [
        LengthSample(RequestFeatures("a", 50, MAX_TOKENS, tenant_id="t"), 20 + i % 5) for i in range(40)
    ]
    return LengthPredictor().fit(samples, model_version=version).to_bytes()


def test_a_missing_artifact_keeps_the_prior_and_logs_one_warning_naming_the_key(
    blob_store: LocalBlobStore, caplog: pytest.LogCaptureFixture
) -> None:
    predictor = LearnedLengthPredictor(blob_store)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert predictor.reload() is False
        assert predictor.reload() is False
    [warning] = _warnings(caplog)  # once, not at every reload
    assert POINTER_KEY in warning and "BlobNotFoundError" in warning and "the prior" in warning
    assert predictor.model_version is None
    assert predictor.predict(_input("a", 77)) == 77  # the prior without history: max_tokens

    write_predictor(blob_store, "v1", b"", {"version": "v1"})  # the pointer now names an empty model
    blob_store.delete("predictors/length/v1.bin")
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert predictor.reload() is False
    assert "predictors/length/v1.bin" in _warnings(caplog)[-1] and "not found" in _warnings(caplog)[-1]


def test_a_corrupt_artifact_keeps_what_is_served_and_logs_a_warning_naming_the_key(
    blob_store: LocalBlobStore, caplog: pytest.LogCaptureFixture
) -> None:
    predictor = LearnedLengthPredictor(blob_store)
    write_predictor(blob_store, "v1", b"garbage", {"version": "v1", "trained_at": T0.isoformat()})
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert predictor.reload() is False
    [warning] = _warnings(caplog)
    assert "predictors/length/v1.bin" in warning and "bad header" in warning and "the prior" in warning
    assert predictor.predict(_input("a", 77)) == 77

    write_predictor(blob_store, "v2", _fitted_artifact("v2"), {"version": "v2", "trained_at": T0.isoformat()})
    assert predictor.reload() is True
    good = predictor.predict(_input("a"))
    assert 15 <= good <= 30

    write_predictor(blob_store, "v3", _fitted_artifact("v3")[:-40], {"version": "v3"})  # truncated artifact
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert predictor.reload() is False
    assert "predictors/length/v3.bin" in _warnings(caplog)[-1] and "serving model v2" in _warnings(caplog)[-1]
    assert predictor.model_version == "v2" and predictor.predict(_input("a")) == good


def test_a_reload_keeps_observations_since_the_training_and_local_histories_of_unknown_adapters(
    blob_store: LocalBlobStore,
) -> None:
    now = [100.0]
    predictor = LearnedLengthPredictor(blob_store, clock=lambda: now[0])
    predictor.observe("t", "a", 5)  # before the training: already in the artifact's history
    predictor.observe("t", "b", 9)  # an adapter the artifact does not know
    now[0] = 300.0
    predictor.observe("t", "a", 6)  # after the training started
    trained = LengthPredictor()
    for _ in range(3):
        trained.observe("t", "a", 50)
    trained_at = "1970-01-01T00:03:20+00:00"  # t = 200 s
    write_predictor(blob_store, "v1", trained.to_bytes(), {"version": "v1", "trained_at": trained_at})
    assert predictor.reload() is True
    assert predictor.history("t", "a").to_state()[0] == [50, 50, 50, 6]  # type: ignore[union-attr]
    assert predictor.history("t", "b").to_state()[0] == [9]  # type: ignore[union-attr]


# ---- GET /v1/admin/predictor -------------------------------------------------------------------------------


def test_the_lifespan_timer_loads_the_newest_artifact(
    make_client: Callable[..., TestClient], blob_store: LocalBlobStore
) -> None:
    write_predictor(blob_store, "v1", _fitted_artifact("v1"), {"version": "v1"})
    before = num_timer_threads("predictor-reload")
    predictor = _services(make_client(predictor_reload_interval_s=0.05)).predictor
    assert num_timer_threads("predictor-reload") == before + 1
    assert wait_for(lambda: predictor.model_version == "v1")
    write_predictor(blob_store, "v2", _fitted_artifact("v2"), {"version": "v2"})
    assert wait_for(lambda: predictor.model_version == "v2")


def test_a_zero_reload_interval_never_reads_artifacts(
    make_client: Callable[..., TestClient], blob_store: LocalBlobStore
) -> None:
    write_predictor(blob_store, "v1", _fitted_artifact("v1"), {"version": "v1"})
    before = num_timer_threads("predictor-reload")
    predictor = _services(make_client(predictor_reload_interval_s=0)).predictor
    assert num_timer_threads("predictor-reload") == before  # no timer: nothing will ever load the artifact
    assert predictor.model_version is None


def test_the_inline_training_timer_starts_only_with_inline_jobs(
    tmp_path: Path, blob_store: LocalBlobStore
) -> None:
    def services(**overrides: object) -> SimpleNamespace:
        settings = Settings(**({"data_dir": tmp_path, "predictor_training_interval_s": 3600} | overrides))
        return SimpleNamespace(settings=settings, predictor=LearnedLengthPredictor(blob_store))

    timer = _start_predictor_training(services(is_inline_jobs=True))  # type: ignore[arg-type]
    assert timer is not None and timer.interval_s == 3600
    timer.stop()
    assert _start_predictor_training(services(is_inline_jobs=False)) is None  # type: ignore[arg-type]
    assert _start_predictor_training(services(predictor_training_interval_s=0)) is None  # type: ignore[arg-type]
    reload_timer = _start_predictor_reload(services(is_inline_jobs=False))  # type: ignore[arg-type]
    assert reload_timer is not None  # every API process reloads, whoever trains
    reload_timer.stop()
    no_learned = SimpleNamespace(settings=Settings(data_dir=tmp_path), predictor=MaxTokensPredictor())
    assert _start_predictor_reload(no_learned) is None  # type: ignore[arg-type]


def test_the_inline_training_timer_trains_and_this_process_serves_the_model(
    make_client: Callable[..., TestClient],
    tenant: TenantHandle,
    db_session: Session,
    blob_store: LocalBlobStore,
) -> None:
    versions = {name: add_ready_version(db_session, tenant.id, name) for name in sorted(MEDIANS)}
    insert_rows(db_session, tenant.id, distinct_specs(versions, 150))  # in 2031: inside any window from now
    predictor = _services(
        make_client(
            predictor_training_interval_s=0.1,
            predictor_min_training_samples=100,
            predictor_reload_interval_s=3600,
        )
    ).predictor
    assert wait_for(lambda: blob_store.exists(POINTER_KEY) and predictor.model_version is not None)
    assert predictor.model_version == read_pointer(blob_store).version
