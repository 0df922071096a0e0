"""Adapters bound to their base model at upload (registry/base_model_choice.py via the upload pipeline), with
two base models of different shapes: the configured local one and a catalog one (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from sqlalchemy.orm import Session, sessionmaker

from registry import adapter_pipeline as pipeline
from registry import repository, validation_job
from registry.base_model_catalog import add_base_model
from registry.base_model_choice import BaseModelChoice, choose_base_model
from registry.base_norms import base_weight_norms
from registry.models import AdapterVersion
from registry.storage import LocalBlobStore
from registry.validation import AdapterValidationError, BaseModelSpec
from settings import Settings

LOCAL = "lorahost-base"
WIDE = "wide"


def _copy_adapter(src: Path, dest: Path, config_base: str | None = None) -> Path:
    dest.mkdir(parents=True)
    for name in pipeline.STORED_FILENAMES:
        shutil.copyfile(src / name, dest / name)
    if config_base is not None:
        config = json.loads((dest / pipeline.CONFIG_FILENAME).read_text())
        config["base_model_name_or_path"] = config_base
        (dest / pipeline.CONFIG_FILENAME).write_text(json.dumps(config))
    return dest


@pytest.fixture
def ctx(
    tmp_path: Path,
    base_model_dir: Path,
    wide_demo_dir: Path,
    db_session: Session,
    db_session_factory: sessionmaker[Session],
) -> pipeline.AdapterJobContext:
    settings = Settings(data_dir=tmp_path, base_model_path=base_model_dir, admin_key="x")
    store = LocalBlobStore(tmp_path / "blobs")
    add_base_model(db_session, store, WIDE, wide_demo_dir / "base", aliases=("org/Wide-Model",))
    db_session.commit()
    return pipeline.AdapterJobContext(
        settings, db_session_factory, store, pipeline.limits_from_settings(settings)
    )


@pytest.fixture
def tenant_id(db_session: Session) -> str:
    tenant = repository.create_tenant(db_session, "acme")
    db_session.commit()
    return tenant.id


@pytest.fixture
def local_adapter(adapter_dirs: dict[str, Path]) -> Path:
    return next(iter(adapter_dirs.values()))


@pytest.fixture
def wide_adapter(wide_demo_dir: Path) -> Path:
    return min((wide_demo_dir / "adapters").iterdir())


def _upload(
    session: Session, ctx: pipeline.AdapterJobContext, tenant_id: str, adapter_dir: Path, name: str, **kwargs
) -> AdapterVersion:
    return pipeline.accept_upload(
        session,
        ctx,
        tenant_id=tenant_id,
        name=name,
        visibility=None,
        upload_dir=adapter_dir,
        names=list(pipeline.STORED_FILENAMES),
        **kwargs,
    )


def test_the_named_base_binds_the_adapter_and_the_job_validates_against_it(
    db_session, ctx, tenant_id, wide_adapter, tmp_path
):
    version = _upload(
        db_session, ctx, tenant_id, _copy_adapter(wide_adapter, tmp_path / "a"), "w", base_model=WIDE
    )
    assert version.adapter.base_model_name == WIDE
    assert validation_job.run_validation_job(ctx, version.id) == "ready"


def test_an_alias_in_adapter_config_binds_without_the_field(
    db_session, ctx, tenant_id, wide_adapter, tmp_path
):
    adapter_dir = _copy_adapter(wide_adapter, tmp_path / "a", config_base="ORG/wide-model")
    version = _upload(db_session, ctx, tenant_id, adapter_dir, "w")
    assert version.adapter.base_model_name == WIDE


def test_an_unknown_base_is_refused_with_the_list_and_nothing_stored(
    db_session, ctx, tenant_id, wide_adapter, tmp_path
):
    with pytest.raises(AdapterValidationError) as caught:
        _upload(
            db_session, ctx, tenant_id, _copy_adapter(wide_adapter, tmp_path / "a"), "w", base_model="gpt-9"
        )
    assert caught.value.code == "unknown_base_model"
    assert f"['{LOCAL}', '{WIDE}']" in caught.value.message
    assert all(k.startswith("models/") for k in ctx.blob_store.list_keys())
    assert repository.count_rows(db_session, AdapterVersion) == 0


def test_several_bases_and_a_config_naming_none_asks_for_the_field(
    db_session, ctx, tenant_id, local_adapter, tmp_path
):
    adapter_dir = _copy_adapter(local_adapter, tmp_path / "a", config_base="/home/me/checkpoints/base")
    with pytest.raises(AdapterValidationError) as caught:
        _upload(db_session, ctx, tenant_id, adapter_dir, "l")
    assert caught.value.code == "base_model_required"
    assert "base_model" in caught.value.message and f"['{LOCAL}', '{WIDE}']" in caught.value.message


def test_the_wrong_base_is_refused_naming_the_one_it_fits(db_session, ctx, tenant_id, wide_adapter, tmp_path):
    adapter_dir = _copy_adapter(wide_adapter, tmp_path / "a")
    with pytest.raises(AdapterValidationError) as caught:
        _upload(db_session, ctx, tenant_id, adapter_dir, "w", base_model=LOCAL)
    assert caught.value.code == "wrong_base_model"
    assert f"it fits ['{WIDE}']" in caught.value.message and f"['{LOCAL}', '{WIDE}']" in caught.value.message
    assert repository.count_rows(db_session, AdapterVersion) == 0


def test_a_new_version_keeps_its_adapters_base(
    db_session, ctx, tenant_id, wide_adapter, local_adapter, tmp_path
):
    first = _upload(
        db_session, ctx, tenant_id, _copy_adapter(wide_adapter, tmp_path / "a"), "w", base_model=WIDE
    )
    validation_job.run_validation_job(ctx, first.id)
    second = _upload(db_session, ctx, tenant_id, _copy_adapter(wide_adapter, tmp_path / "b"), "w")  # no field
    assert second.number == 2 and second.adapter.base_model_name == WIDE
    with pytest.raises(AdapterValidationError) as caught:
        _upload(
            db_session, ctx, tenant_id, _copy_adapter(local_adapter, tmp_path / "c"), "w", base_model=LOCAL
        )
    assert caught.value.code == "base_model_mismatch" and repr(WIDE) in caught.value.message


def test_an_adapter_may_not_take_a_base_models_name(db_session, ctx, tenant_id, wide_adapter, tmp_path):
    with pytest.raises(Exception, match="reserved|base model"):
        _upload(
            db_session, ctx, tenant_id, _copy_adapter(wide_adapter, tmp_path / "a"), WIDE, base_model=WIDE
        )


def _choice(name: str, *aliases: str) -> BaseModelChoice:
    spec = BaseModelSpec("llama", 64, 128, 2, 4, 2, 16, 256)
    return BaseModelChoice(name, aliases, spec)


def test_choose_base_model_order_of_precedence() -> None:
    one, two = _choice("one", "org/One"), _choice("two")
    assert choose_base_model([one], requested=None, bound=None, config_base="elsewhere") is one
    assert choose_base_model([one, two], requested=None, bound=None, config_base="org/one") is one
    assert choose_base_model([one, two], requested="two", bound=None, config_base="org/one") is two
    assert choose_base_model([one, two], requested=None, bound="two", config_base="org/one") is two
    with pytest.raises(AdapterValidationError, match="no longer served"):
        choose_base_model([one], requested=None, bound="gone", config_base=None)
    with pytest.raises(AdapterValidationError, match="lorahost models add"):
        choose_base_model([], requested=None, bound=None, config_base=None)


def test_a_catalog_models_recorded_norms_bound_adapter_updates_without_its_weights(
    db_session, ctx, tenant_id, wide_adapter, wide_demo_dir, tmp_path
):
    """The catalog stored the base weights' norms at add: a catalog-only model bounds updates like a local one."""
    [wide] = [c for c in ctx.base_model_choices(db_session) if c.name == WIDE]
    assert wide.spec.model_dir is None
    assert wide.spec.weight_norms == base_weight_norms(wide_demo_dir / "base")
    adapter_dir = _copy_adapter(wide_adapter, tmp_path / "a")
    config = json.loads((adapter_dir / pipeline.CONFIG_FILENAME).read_text())
    config["lora_alpha"] = config["r"]  # scale 1
    (adapter_dir / pipeline.CONFIG_FILENAME).write_text(json.dumps(config))
    weights_path = adapter_dir / pipeline.WEIGHTS_FILENAME
    # every value 100: within the absolute bound (256) but ||B|| * ||A|| is far above 1024x any base weight's norm
    save_file({k: np.full_like(v, 100.0) for k, v in load_file(weights_path).items()}, weights_path)
    with pytest.raises(AdapterValidationError) as caught:
        _upload(db_session, ctx, tenant_id, adapter_dir, "w", base_model=WIDE)
    assert caught.value.code == "update_too_large"
