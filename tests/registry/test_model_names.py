"""Issue 33 item 6: one name rule for base models and aliases (fullmatch: no trailing newline), aliases unique
across every name and alias of every model (removed ones included), decided by the database in a race."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from registry import model_names, repository
from registry.base_model_catalog import add_base_model, remove_base_model
from registry.db import make_engine, make_session_factory
from registry.errors import ConflictError, InvalidRequestError
from registry.models import BaseModelName, CatalogModel
from registry.storage import LocalBlobStore
from tests.registry.db_fixtures import migrated_postgres_database


@pytest.fixture
def store(tmp_path: Path) -> LocalBlobStore:
    return LocalBlobStore(tmp_path / "blobs")


@pytest.fixture
def own_postgres_url() -> Iterator[str]:
    """A migrated PostgreSQL database of this test's own (its work really commits), dropped afterwards."""
    with migrated_postgres_database() as url:
        yield url


BAD_NAMES = [
    "evil\n",
    "evil\r",
    "Evil",
    "../../etc",
    "a/b",
    "a..b",
    "-a",
    "a-",
    "",
    "a b",
    "<img src=x>",
    "x" * 65,
]
BAD_ALIASES = [
    "evil\n",
    "../../etc",
    "/etc/passwd",
    "org/../x",
    "org/",
    "a/b/c",
    '<img src=x onerror="alert(1)">',
    "a b",
    "tab\there",
    "caf\u00e9",
    "x" * 97,
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_bad_model_name_is_refused_before_anything_is_stored(
    db_session: Session, store: LocalBlobStore, base_model_dir: Path, tmp_path: Path, name: str
) -> None:
    with pytest.raises(InvalidRequestError, match="invalid base model name"):
        add_base_model(db_session, store, name, base_model_dir)
    assert not (tmp_path / "blobs").exists() or not any((tmp_path / "blobs").rglob("*"))
    assert db_session.scalars(select(CatalogModel)).all() == []


@pytest.mark.parametrize("alias", BAD_ALIASES)
def test_a_bad_alias_is_refused_before_anything_is_stored(
    db_session: Session, store: LocalBlobStore, base_model_dir: Path, tmp_path: Path, alias: str
) -> None:
    with pytest.raises(InvalidRequestError, match="invalid base model alias"):
        add_base_model(db_session, store, "tiny-a", base_model_dir, aliases=(alias,))
    assert not (tmp_path / "blobs").exists() or not any((tmp_path / "blobs").rglob("*"))


@pytest.mark.parametrize("alias", ["org/Model-1.5B", "meta-llama/Llama-3.2-1B_x", "tiny", "x" * 96])
def test_hugging_face_repo_ids_are_valid_aliases(alias: str) -> None:
    assert model_names.check_alias(alias) == alias


def test_names_and_aliases_are_unique_across_models_removed_ones_included(
    db_session: Session, store: LocalBlobStore, base_model_dir: Path
) -> None:
    add_base_model(
        db_session, store, "tiny-a", base_model_dir, aliases=("org/Tiny-A", "tiny-a", "ORG/tiny-a")
    )
    first = add_base_model(db_session, store, "tiny-b", base_model_dir, aliases=("org/b",))
    assert first.aliases == ["org/b"]
    # another model's alias (case-insensitive), another model's name as an alias
    for aliases in (("org/tiny-a",), ("tiny-a",)):
        with pytest.raises(ConflictError, match="of base model 'tiny-a'"):
            add_base_model(db_session, store, "tiny-c", base_model_dir, aliases=aliases)
    remove_base_model(db_session, "tiny-b")
    with pytest.raises(ConflictError, match=r"alias of base model 'tiny-b' \(removed"):
        add_base_model(db_session, store, "tiny-c", base_model_dir, aliases=("org/B",))
    # a model's name equal to another's alias
    add_base_model(db_session, store, "tiny-d", base_model_dir, aliases=("tiny-e",))
    with pytest.raises(ConflictError, match="alias of base model 'tiny-d'"):
        add_base_model(db_session, store, "tiny-e", base_model_dir)
    rows = {r.name: (r.model.name, r.is_alias) for r in db_session.scalars(select(BaseModelName))}
    assert rows == {
        "tiny-a": ("tiny-a", False),
        "org/tiny-a": ("tiny-a", True),
        "tiny-b": ("tiny-b", False),
        "org/b": ("tiny-b", True),
        "tiny-d": ("tiny-d", False),
        "tiny-e": ("tiny-d", True),
    }


def test_a_removed_model_added_again_takes_its_names_back(
    db_session: Session, store: LocalBlobStore, base_model_dir: Path
) -> None:
    old = add_base_model(db_session, store, "tiny-a", base_model_dir, aliases=("org/tiny",))
    remove_base_model(db_session, "tiny-a")
    new = add_base_model(db_session, store, "tiny-a", base_model_dir, aliases=("org/tiny", "org/more"))
    assert new.id != old.id
    held = {r.name: r.model_id for r in db_session.scalars(select(BaseModelName))}
    assert held == {"tiny-a": new.id, "org/tiny": new.id, "org/more": new.id}


def test_a_live_adapter_name_is_refused_as_a_model_name_or_alias(
    db_session: Session, store: LocalBlobStore, base_model_dir: Path
) -> None:
    tenant = repository.create_tenant(db_session, "acme")
    repository.get_or_create_adapter(db_session, tenant.id, "tuned", base_model_name="x")
    for name, aliases in (("tuned", ()), ("tiny-a", ("Tuned",))):
        with pytest.raises(ConflictError, match="adapter of tenant 'acme'"):
            add_base_model(db_session, store, name, base_model_dir, aliases=aliases)
    add_base_model(db_session, store, "tiny-z", base_model_dir, aliases=("zz",))
    for name in ("tiny-z", "zz"):  # and the other way round
        with pytest.raises(InvalidRequestError, match="is reserved"):
            model_names.check_adapter_name_free(db_session, name)


@pytest.mark.slow
def test_two_concurrent_adds_cannot_both_take_an_alias(
    own_postgres_url: str, store: LocalBlobStore, base_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The friendly pre-check is switched off: the primary key alone must refuse the second add, whether it
    inserts while the first is uncommitted (it waits, then fails) or after."""
    monkeypatch.setattr("registry.base_model_catalog.check_names_free", lambda *_: None)
    engine = make_engine(own_postgres_url)
    factory = make_session_factory(engine)
    tag = uuid.uuid4().hex[:8]
    shared = f"org/shared-{tag}"
    outcome: list[BaseException | None] = []
    try:
        with factory() as first:
            add_base_model(first, store, f"race-a-{tag}", base_model_dir, aliases=(shared,))

            def second() -> None:
                with factory() as session:
                    try:
                        add_base_model(session, store, f"race-b-{tag}", base_model_dir, aliases=(shared,))
                        session.commit()
                        outcome.append(None)
                    except ConflictError as exc:
                        session.rollback()
                        outcome.append(exc)

            racer = threading.Thread(target=second)
            racer.start()
            first.commit()
            racer.join()
        assert len(outcome) == 1 and isinstance(outcome[0], ConflictError)
        with factory() as session:
            row = session.get(BaseModelName, shared)
            assert row is not None and row.model.name == f"race-a-{tag}"
    finally:
        engine.dispose()


def _is_waiting_for_a_lock(session: Session) -> bool:
    query = text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    return bool(session.scalar(query))


@pytest.mark.slow
def test_a_model_add_racing_an_adapters_creation_waits_and_sees_the_adapter(
    own_postgres_url: str, store: LocalBlobStore, base_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The adapter's write transaction holds base_model_names in SHARE mode: the add's insert waits for it to
    commit, then its adapter check sees the adapter (without the lock both would be created)."""
    monkeypatch.setattr("registry.base_model_catalog.check_names_free", lambda *_: None)
    engine = make_engine(own_postgres_url)
    factory = make_session_factory(engine)
    name = f"race-{uuid.uuid4().hex[:8]}"
    outcome: list[BaseException | None] = []

    def add_model() -> None:
        with factory() as session:
            try:
                add_base_model(session, store, name, base_model_dir)
                session.commit()
                outcome.append(None)
            except ConflictError as exc:
                session.rollback()
                outcome.append(exc)

    try:
        with factory() as creating, factory() as watcher:
            tenant = repository.create_tenant(creating, f"t-{name}")
            model_names.check_adapter_name_free(creating, name, is_locked=True)
            repository.get_or_create_adapter(creating, tenant.id, name, base_model_name="x")
            racer = threading.Thread(target=add_model)
            racer.start()
            while racer.is_alive() and not _is_waiting_for_a_lock(watcher):
                watcher.rollback()  # a fresh snapshot of pg_stat_activity each time
            creating.commit()
            racer.join()
        assert len(outcome) == 1 and isinstance(outcome[0], ConflictError), outcome
    finally:
        engine.dispose()
