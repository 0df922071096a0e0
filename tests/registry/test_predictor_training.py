"""The length predictor's training job on hand-made usage rows: samples, chronological split, held-out
metrics, the versioned artifact + pointer in the blob store, skipping with too few samples."""

from __future__ import annotations

import io
import json
import logging
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from registry.predictor_artifacts import (
    NUM_KEPT_VERSIONS,
    POINTER_KEY,
    PREFIX,
    read_blob,
    read_pointer,
    write_predictor,
)
from registry.predictor_training import chronological_split, load_length_samples, run_predictor_training
from registry.storage import LocalBlobStore
from scheduler.length.length_predictor import LengthPredictor, RequestFeatures
from settings import Settings
from tests.registry.predictor_rows import (
    MAX_TOKENS,
    MEDIANS,
    T0,
    RowSpec,
    distinct_specs,
    insert_rows,
    make_versions,
)

NOW = T0 + timedelta(days=1)


def _settings(tmp_path: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "data_dir": tmp_path,
        "predictor_min_training_samples": 100,
        "predictor_training_window_s": 2 * 86400.0,
    }
    return Settings(**(values | overrides))


@pytest.fixture
def store(tmp_path: Path) -> LocalBlobStore:
    return LocalBlobStore(tmp_path / "blobs")


def test_training_writes_a_versioned_artifact_and_then_a_pointer_with_heldout_metrics(
    db_session: Session, db_session_factory: sessionmaker[Session], store: LocalBlobStore, tmp_path: Path
) -> None:
    tenant_id, versions = make_versions(db_session, sorted(MEDIANS))
    specs = distinct_specs(versions, 250)
    insert_rows(db_session, tenant_id, specs)

    run = run_predictor_training(db_session_factory, store, _settings(tmp_path), now=NOW)

    assert run is not None
    version = run.pointer.version
    assert store.list_keys(PREFIX) == sorted(
        [f"{PREFIX}{version}.bin", f"{PREFIX}{version}.json", POINTER_KEY]
    )
    assert read_pointer(store) == run.pointer
    metadata = json.loads(read_blob(store, run.pointer.metadata_key))
    assert metadata == run.metadata
    counts = (metadata["num_samples"], metadata["num_training_samples"], metadata["num_heldout_samples"])
    assert counts == (250, 200, 50)
    assert metadata["trained_at"] == NOW.isoformat()
    heldout = metadata["heldout"]
    assert heldout["overall"]["num_samples"] == 50
    assert {entry["adapter_key"] for entry in heldout["per_adapter"]} == {v.id for v in versions.values()}
    assert sum(entry["num_samples"] for entry in heldout["per_adapter"]) == 50
    # judged on the newest 50 rows: far better than predicting max_tokens
    max_tokens_mae = sum(MAX_TOKENS - s.completion_tokens for s in specs[-50:]) / 50
    assert heldout["overall"]["mae"] < max_tokens_mae / 5
    assert heldout["overall"]["bucket_accuracy"] >= 0.8

    model = LengthPredictor.from_bytes(read_blob(store, run.pointer.artifact_key))
    assert model.model_version == version and model.is_fitted
    for name, median in MEDIANS.items():
        predicted = model.predict(RequestFeatures(versions[name].id, 100, MAX_TOKENS, tenant_id=tenant_id))
        assert abs(predicted - median) < 0.3 * median, (name, predicted)
        # the shipped histories end with the newest (held-out) request of each adapter
        history = model.history(tenant_id, versions[name].id)
        assert history is not None
        newest = [s.completion_tokens for s in specs if s.version_id == versions[name].id][-1]
        assert history.to_state()[0][-1] == newest


def test_too_few_samples_write_nothing_and_say_so(
    db_session: Session,
    db_session_factory: sessionmaker[Session],
    store: LocalBlobStore,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    tenant_id, versions = make_versions(db_session, sorted(MEDIANS))
    insert_rows(db_session, tenant_id, distinct_specs(versions, 60))
    with caplog.at_level(logging.INFO, logger="registry.predictor_training"):
        assert run_predictor_training(db_session_factory, store, _settings(tmp_path), now=NOW) is None
    assert store.list_keys() == []
    [record] = [r for r in caplog.records if r.name == "registry.predictor_training"]
    assert "skipped" in record.message and "60 finished" in record.message
    assert "predictor_min_training_samples=100" in record.message


def test_samples_are_the_newest_finished_rows_with_features_in_the_window_oldest_first(
    db_session: Session,
) -> None:
    tenant_id, versions = make_versions(db_session, ["short"])
    key = versions["short"].id
    insert_rows(db_session, tenant_id, [RowSpec(key, 1)], start=T0 - timedelta(days=3))  # before the window
    insert_rows(
        db_session,
        tenant_id,
        [
            RowSpec(key, 10, is_chat=True),
            RowSpec(key, 11, status="aborted"),  # the true length is unknown
            RowSpec(key, 12, max_tokens=None),  # written before features were recorded
            RowSpec(None, 13, prompt_tokens=7),
            RowSpec(key, 14, status="error"),
            RowSpec(key, 15),
            RowSpec(key, 16),
        ],
    )
    samples = load_length_samples(db_session, T0 - timedelta(days=1), max_samples=3)
    assert [s.num_output_tokens for s in samples] == [13, 15, 16]  # the newest three, oldest first
    assert samples[0].features.adapter_id is None and samples[0].features.num_prompt_tokens == 7
    assert {s.features.tenant_id for s in samples} == {tenant_id}  # histories are keyed by tenant too
    everything = load_length_samples(db_session, T0 - timedelta(days=1), max_samples=100)
    assert [s.num_output_tokens for s in everything] == [10, 13, 15, 16]
    assert everything[0].features.is_chat and not everything[1].features.is_chat


def test_the_split_is_chronological_with_both_parts_non_empty() -> None:
    samples = [object()] * 10
    train, heldout = chronological_split(samples, 0.2)  # type: ignore[arg-type]
    assert (len(train), len(heldout)) == (8, 2)
    assert [len(part) for part in chronological_split(samples[:2], 0.2)] == [1, 1]  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 2"):
        chronological_split(samples[:1])  # type: ignore[arg-type]


def test_only_the_newest_versions_are_kept_and_the_pointer_names_the_last(store: LocalBlobStore) -> None:
    names = [f"2031030{i}T000000Z-0000000{i}" for i in range(1, 6)]
    for name in names:
        write_predictor(store, name, b"model " + name.encode(), {"version": name})
    assert read_pointer(store).version == names[-1]
    kept = {
        key.removeprefix(PREFIX).rsplit(".", 1)[0] for key in store.list_keys(PREFIX) if key != POINTER_KEY
    }
    assert kept == set(names[-NUM_KEPT_VERSIONS:])


def test_predictor_settings_are_validated(tmp_path: Path) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="LORAHOST_PREDICTOR_MAX_TRAINING_SAMPLES"):
        Settings(data_dir=tmp_path, predictor_min_training_samples=500, predictor_max_training_samples=100)
    with pytest.raises(ValidationError, match="learned, max_tokens"):
        Settings(data_dir=tmp_path, length_predictor="oracle")
    with pytest.raises(ValidationError):
        Settings(data_dir=tmp_path, predictor_reload_interval_s=-1)
    assert Settings(data_dir=tmp_path).predictor.length_predictor == "learned"


def test_a_corrupt_pointer_is_a_predictor_artifact_error(store: LocalBlobStore) -> None:
    from scheduler.length.length_predictor_artifact import PredictorArtifactError

    store.put_stream(POINTER_KEY, io.BytesIO(b"{not json"))
    with pytest.raises(PredictorArtifactError, match="pointer is corrupt"):
        read_pointer(store)


def test_training_keeps_one_history_per_tenant_on_a_shared_model(
    db_session: Session, db_session_factory: sessionmaker[Session], store: LocalBlobStore, tmp_path: Path
) -> None:
    """Issue 19: A's long base-model outputs are not in B's history (in training rows or the artifact)."""
    tenant_a, _ = make_versions(db_session, [])
    tenant_b, _ = make_versions(db_session, [])
    insert_rows(db_session, tenant_b, [RowSpec(None, 1)] * 10)
    insert_rows(db_session, tenant_a, [RowSpec(None, 300)] * 200, start=T0 + timedelta(seconds=10))

    run = run_predictor_training(db_session_factory, store, _settings(tmp_path), now=NOW)

    assert run is not None
    model = LengthPredictor.from_bytes(read_blob(store, run.pointer.artifact_key))
    history_b, history_a = model.history(tenant_b, None), model.history(tenant_a, None)
    assert history_b is not None and history_b.to_state()[0] == [1] * 10
    assert history_a is not None and set(history_a.to_state()[0]) == {300}
    assert model.history(None, None) is None  # no history shared by every tenant of the base model
