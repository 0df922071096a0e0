"""Repository queries on SQLite and PostgreSQL (each test rolled back)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from registry import api_keys, repository
from registry.errors import InvalidRequestError, NotFoundError, PermissionDeniedError
from registry.models import AdapterVersion, ApiKey


def _adapter_with_versions(session: Session, tenant_id: str, name: str, statuses: list[str], **kwargs):
    adapter = repository.get_or_create_adapter(session, tenant_id, name, base_model_name="base", **kwargs)
    for status in statuses:
        repository.add_adapter_version(session, tenant_id, adapter, status=status)
    session.flush()
    session.refresh(adapter)
    return adapter


def test_creates_lists_and_updates_tenants(db_session: Session) -> None:
    plan = repository.create_price_plan(db_session, "pro", price_per_1m_prompt_tokens=Decimal("0.5"))
    tenant = repository.create_tenant(db_session, "acme")
    assert tenant.is_active and tenant.plan_id is None
    repository.update_tenant(db_session, tenant.id, is_active=False, plan_id=plan.id)
    assert [t.name for t in repository.list_tenants(db_session)] == ["acme"]
    assert repository.get_tenant(db_session, tenant.id).plan_id == plan.id
    assert not tenant.is_active
    repository.update_tenant(db_session, tenant.id, plan_id=None)
    assert tenant.plan_id is None


def test_unknown_tenant_or_plan_is_not_found(db_session: Session) -> None:
    with pytest.raises(NotFoundError):
        repository.get_tenant(db_session, "missing")
    with pytest.raises(NotFoundError):
        repository.create_tenant(db_session, "acme", plan_id="no-such-plan")


def test_api_key_is_stored_only_as_salted_hash_and_authenticates(db_session: Session) -> None:
    tenant = repository.create_tenant(db_session, "acme")
    row, key = api_keys.create_api_key(db_session, tenant.id)
    secret = key.split("_", 2)[2]
    stored = db_session.execute(text("SELECT salt, secret_hash FROM api_keys")).all()
    assert all(secret not in "".join(r) and key not in "".join(r) for r in stored)
    assert api_keys.find_api_key(db_session, key).id == row.id


def test_two_keys_with_same_secret_get_different_hashes(db_session: Session) -> None:
    tenant = repository.create_tenant(db_session, "acme")
    api_keys.create_api_key(db_session, tenant.id)
    api_keys.create_api_key(db_session, tenant.id)
    salts = db_session.scalars(select(ApiKey.salt)).all()
    assert len(set(salts)) == 2


@pytest.mark.parametrize(
    "mangle", [lambda k: k + "x", lambda k: k.replace("lh_", "xx_"), lambda k: "lh_nope_abc"]
)
def test_wrong_key_does_not_authenticate(db_session: Session, mangle) -> None:
    tenant = repository.create_tenant(db_session, "acme")
    _, key = api_keys.create_api_key(db_session, tenant.id)
    assert api_keys.find_api_key(db_session, mangle(key)) is None


def test_revoked_key_does_not_authenticate(db_session: Session) -> None:
    tenant = repository.create_tenant(db_session, "acme")
    row, key = api_keys.create_api_key(db_session, tenant.id)
    api_keys.revoke_api_key(db_session, row.id)
    assert api_keys.find_api_key(db_session, key) is None


def test_reupload_numbers_versions_consecutively(db_session: Session) -> None:
    tenant = repository.create_tenant(db_session, "acme")
    adapter = _adapter_with_versions(db_session, tenant.id, "my-lora", ["ready", "ready", "failed"])
    assert [v.number for v in adapter.versions] == [1, 2, 3]


def test_latest_ready_version_is_served_and_name_at_n_pins(db_session: Session) -> None:
    tenant = repository.create_tenant(db_session, "acme")
    _adapter_with_versions(db_session, tenant.id, "my-lora", ["ready", "ready", "failed"])
    assert repository.resolve_model(db_session, tenant.id, "my-lora")[1].number == 2
    assert repository.resolve_model(db_session, tenant.id, "my-lora@1")[1].number == 1
    with pytest.raises(NotFoundError, match="failed, not ready"):
        repository.resolve_model(db_session, tenant.id, "my-lora@3")
    with pytest.raises(NotFoundError):
        repository.resolve_model(db_session, tenant.id, "my-lora@9")


def test_other_tenants_private_adapter_is_not_found(db_session: Session) -> None:
    alice, bob = repository.create_tenant(db_session, "alice"), repository.create_tenant(db_session, "bob")
    _adapter_with_versions(db_session, alice.id, "secret", ["ready"])
    with pytest.raises(NotFoundError):
        repository.find_visible_adapter(db_session, bob.id, "secret")
    with pytest.raises(NotFoundError):
        repository.soft_delete_adapter(db_session, bob.id, "secret")
    assert repository.list_ready_models(db_session, bob.id) == []


def test_public_adapter_is_visible_but_not_deletable_by_others(db_session: Session) -> None:
    alice, bob = repository.create_tenant(db_session, "alice"), repository.create_tenant(db_session, "bob")
    _adapter_with_versions(db_session, alice.id, "shared", ["ready"], visibility="public")
    assert repository.resolve_model(db_session, bob.id, "shared")[0].tenant_id == alice.id
    assert [a.name for a, _ in repository.list_ready_models(db_session, bob.id)] == ["shared"]
    with pytest.raises(PermissionDeniedError):
        repository.soft_delete_adapter(db_session, bob.id, "shared")


def test_own_adapter_shadows_a_public_one_of_the_same_name(db_session: Session) -> None:
    alice, bob = repository.create_tenant(db_session, "alice"), repository.create_tenant(db_session, "bob")
    _adapter_with_versions(db_session, alice.id, "same", ["ready"], visibility="public")
    _adapter_with_versions(db_session, bob.id, "same", ["ready"])
    assert repository.find_visible_adapter(db_session, bob.id, "same").tenant_id == bob.id


def test_soft_deleted_adapter_disappears_and_its_name_can_be_reused(db_session: Session) -> None:
    tenant = repository.create_tenant(db_session, "acme")
    old = _adapter_with_versions(db_session, tenant.id, "my-lora", ["ready", "ready"])
    repository.soft_delete_adapter(db_session, tenant.id, "my-lora")
    assert repository.list_own_adapters(db_session, tenant.id) == []
    with pytest.raises(NotFoundError):
        repository.resolve_model(db_session, tenant.id, "my-lora")
    new = _adapter_with_versions(db_session, tenant.id, "my-lora", ["ready"])
    assert new.id != old.id and [v.number for v in new.versions] == [1]


def test_adapter_with_no_ready_version_is_not_listed_as_model(db_session: Session) -> None:
    tenant = repository.create_tenant(db_session, "acme")
    _adapter_with_versions(db_session, tenant.id, "pending", ["validating"])
    assert repository.list_ready_models(db_session, tenant.id) == []
    with pytest.raises(NotFoundError, match="no ready version"):
        repository.resolve_model(db_session, tenant.id, "pending")


@pytest.mark.parametrize("name", ["", "Upper", "-lead", "has space", "a/b", "a@1", "x" * 65, "ümlaut"])
def test_invalid_adapter_names_are_refused_with_the_rule(name: str) -> None:
    with pytest.raises(InvalidRequestError, match="lowercase letters"):
        repository.check_adapter_name(name)


def test_reserved_adapter_name_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="reserved"):
        repository.check_adapter_name("lorahost-base", reserved=("lorahost-base",))


@pytest.mark.parametrize(
    ("ref", "expected"), [("a", ("a", None)), ("a@3", ("a", 3)), ("a.b-c_d@12", ("a.b-c_d", 12))]
)
def test_parses_model_refs(ref: str, expected: tuple) -> None:
    parsed = repository.parse_model_ref(ref)
    assert (parsed.name, parsed.version) == expected


@pytest.mark.parametrize(
    "ref",
    [
        "a@",
        "a@0",
        "a@x",
        "a@-1",
        "a@\u0661",
        "a@\u00b2",
        "a@1\n",
        "a@ 1",
        "a@1_0",
        "a@" + "9" * 11,
        "a@2147483648",
    ],
)
def test_bad_version_suffix_is_refused(ref: str) -> None:
    with pytest.raises(InvalidRequestError):
        repository.parse_model_ref(ref)


def test_version_rows_keep_lora_metadata(db_session: Session) -> None:
    tenant = repository.create_tenant(db_session, "acme")
    adapter = repository.get_or_create_adapter(db_session, tenant.id, "m", base_model_name="base")
    repository.add_adapter_version(
        db_session,
        tenant.id,
        adapter,
        status="ready",
        rank=8,
        alpha=16.0,
        target_modules=["q_proj"],
        num_bytes=10,
    )
    db_session.expire_all()
    row = db_session.scalars(select(AdapterVersion)).one()
    assert (row.rank, row.alpha, row.target_modules, row.num_bytes) == (8, 16.0, ["q_proj"], 10)
    assert row.created_at.tzinfo is not None


def test_lists_price_plans_by_name(db_session: Session) -> None:
    repository.create_price_plan(db_session, "pro")
    repository.create_price_plan(db_session, "basic")
    assert [p.name for p in repository.list_price_plans(db_session)] == ["basic", "pro"]
