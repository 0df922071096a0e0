"""Server-side console sessions: recorded by hash, found while live, revoked at sign-out, ended rows deleted."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from registry import console_sessions
from registry.api_keys import create_api_key
from registry.models import ConsoleSessionRecord, utcnow
from registry.repository import create_tenant


def _tenant_and_key(db: Session) -> tuple[str, str]:
    tenant = create_tenant(db, "acme")
    key, _ = create_api_key(db, tenant.id)
    return tenant.id, key.id


def test_a_recorded_session_is_found_by_its_id_and_stores_only_its_hash(db_session: Session) -> None:
    tenant_id, key_id = _tenant_and_key(db_session)
    expires_at = utcnow() + timedelta(hours=1)
    console_sessions.record_session(
        db_session, "the-session-id", "tenant", expires_at, tenant_id=tenant_id, api_key_id=key_id
    )
    row = console_sessions.find_live_session(db_session, "the-session-id")
    assert row is not None and (row.tenant_id, row.api_key_id, row.role) == (tenant_id, key_id, "tenant")
    assert row.session_id_hash == console_sessions.hash_session_id("the-session-id") != "the-session-id"
    assert console_sessions.find_live_session(db_session, "another-id") is None


def test_a_revoked_or_expired_session_is_not_live(db_session: Session) -> None:
    now = utcnow()
    console_sessions.record_session(db_session, "op", "operator", now + timedelta(hours=1))
    assert console_sessions.find_live_session(db_session, "op") is not None
    assert console_sessions.find_live_session(db_session, "op", now + timedelta(hours=2)) is None
    assert console_sessions.revoke_session(db_session, "op")
    assert not console_sessions.revoke_session(db_session, "op")  # idempotent
    db_session.expire_all()
    assert console_sessions.find_live_session(db_session, "op") is None


def test_a_new_sign_in_deletes_the_ended_sessions_only(db_session: Session) -> None:
    now = utcnow()
    console_sessions.record_session(db_session, "expired", "operator", now + timedelta(seconds=1))
    console_sessions.record_session(db_session, "revoked", "operator", now + timedelta(hours=1))
    console_sessions.record_session(db_session, "live", "operator", now + timedelta(hours=1))
    console_sessions.revoke_session(db_session, "revoked")
    db_session.execute(
        update(ConsoleSessionRecord)
        .where(ConsoleSessionRecord.session_id_hash == console_sessions.hash_session_id("expired"))
        .values(expires_at=now - timedelta(seconds=1))
    )
    console_sessions.record_session(db_session, "new", "operator", now + timedelta(hours=1))
    kept = set(db_session.scalars(select(ConsoleSessionRecord.session_id_hash)))
    assert kept == {console_sessions.hash_session_id(s) for s in ("live", "new")}
