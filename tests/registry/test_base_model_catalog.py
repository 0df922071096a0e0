"""The base-model catalog (registry/base_model_catalog.py) on SQLite and PostgreSQL: a model's files stored
content-addressed with their digests, its shape recorded, names unique among live models, bad directories
refused with nothing stored, removal refused while ready adapters are bound to it unless forced."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from registry import repository
from registry.base_model_catalog import (
    add_base_model,
    get_base_model,
    list_base_models,
    num_ready_adapters,
    remove_base_model,
    unpublish_manifest,
)
from registry.base_model_manifest import ModelFile, manifest_key, parse_manifest
from registry.digests import sha256_file
from registry.errors import ConflictError, InvalidRequestError, NotFoundError
from registry.storage import LocalBlobStore


@pytest.fixture
def store(tmp_path: Path) -> LocalBlobStore:
    return LocalBlobStore(tmp_path / "blobs")


def test_a_model_is_stored_by_content_and_recorded_with_its_shape(
    db_session: Session, store: LocalBlobStore, base_model_dir: Path
) -> None:
    model = add_base_model(
        db_session, store, "tiny-a", base_model_dir, engines=("native", "vllm"), aliases=("x/y",)
    )
    config = json.loads((base_model_dir / "config.json").read_text())
    assert (
        model.shape["hidden_size"] == config["hidden_size"]
        and model.shape["num_layers"] == config["num_hidden_layers"]
    )
    names = {f["path"] for f in model.files}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
    for record in model.files:
        digest = sha256_file(base_model_dir / record["path"])
        assert record["sha256"] == digest and record["blob_key"] == f"models/tiny-a/{digest}/{record['path']}"
        assert store.size(record["blob_key"]) == record["num_bytes"]
    assert model.num_bytes == sum(f["num_bytes"] for f in model.files)
    assert [m.name for m in list_base_models(db_session)] == ["tiny-a"]
    with store.open(manifest_key("tiny-a")) as f:  # what workers read by name
        assert parse_manifest(f.read()) == ("tiny-a", [ModelFile(**r) for r in model.files])
    assert get_base_model(db_session, "tiny-a").engines == ["native", "vllm"] and model.aliases == ["x/y"]


def test_a_live_name_is_unique_and_unknown_names_list_the_catalog(
    db_session: Session, store: LocalBlobStore, base_model_dir: Path
) -> None:
    add_base_model(db_session, store, "tiny-a", base_model_dir)
    with pytest.raises(ConflictError, match="already in the catalog"):
        add_base_model(db_session, store, "tiny-a", base_model_dir)
    with pytest.raises(NotFoundError, match=r"no base model 'other'.*available: \['tiny-a'\]"):
        get_base_model(db_session, "other")


@pytest.mark.parametrize(
    ("name", "engines", "damage", "message"),
    [
        ("Tiny_A", ("native",), None, "invalid base model name"),
        ("tiny-a", ("tgi",), None, "unknown engine"),
        ("tiny-a", ("native",), "config.json", "no config.json"),
        ("tiny-a", ("native",), "model.safetensors", "no \\*.safetensors"),
        ("tiny-a", ("native",), "tokenizer.json", "no tokenizer.json"),
    ],
)
def test_a_bad_model_is_refused_with_nothing_stored_or_recorded(
    db_session: Session,
    store: LocalBlobStore,
    base_model_dir: Path,
    tmp_path: Path,
    name: str,
    engines: tuple[str, ...],
    damage: str | None,
    message: str,
) -> None:
    model_dir = tmp_path / "model"
    shutil.copytree(base_model_dir, model_dir)
    if damage is not None:
        (model_dir / damage).unlink()
    with pytest.raises(InvalidRequestError, match=message):
        add_base_model(db_session, store, name, model_dir, engines=engines)
    assert list_base_models(db_session) == [] and store.list_keys() == []


def test_an_unsupported_architecture_is_refused(
    db_session: Session, store: LocalBlobStore, base_model_dir: Path, tmp_path: Path
) -> None:
    model_dir = tmp_path / "model"
    shutil.copytree(base_model_dir, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps(config | {"model_type": "gpt2"}))
    with pytest.raises(InvalidRequestError, match="not supported"):
        add_base_model(db_session, store, "gpt", model_dir)


def test_removal_waits_for_its_adapters_unless_forced_and_frees_the_name(
    db_session: Session, store: LocalBlobStore, base_model_dir: Path
) -> None:
    add_base_model(db_session, store, "tiny-a", base_model_dir)
    tenant = repository.create_tenant(db_session, "acme")
    adapter = repository.get_or_create_adapter(db_session, tenant.id, "tuned", base_model_name="tiny-a")
    repository.add_adapter_version(db_session, tenant.id, adapter, status="ready", sha256="0" * 64, rank=4)
    assert num_ready_adapters(db_session, "tiny-a") == 1
    with pytest.raises(ConflictError, match="1 ready adapter"):
        remove_base_model(db_session, "tiny-a")
    removed = remove_base_model(db_session, "tiny-a", is_forced=True)
    unpublish_manifest(store, "tiny-a")
    assert not store.exists(manifest_key("tiny-a"))  # no new worker starts on it
    assert removed.status == "removed" and removed.removed_at is not None
    assert list_base_models(db_session) == []
    again = add_base_model(db_session, store, "tiny-a", base_model_dir)  # the name is free again
    assert again.id != removed.id and again.status == "ready"
