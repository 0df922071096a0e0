"""Server-side console sessions: recorded at sign-in, looked up on every console request, revoked at sign-out.

Only a SHA-256 of the session id is stored: a database reader cannot forge a cookie from it (the cookie also
needs the console secret's signature), and the id itself exists only in the signed cookie. The database is
shared, so a sign-out on one API replica ends the session on all of them. Sessions that expired or were revoked
are deleted on later sign-ins: the table holds live sessions plus those ended since the last sign-in.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

from sqlalchemy import delete, or_, update
from sqlalchemy.orm import Session

from registry.models import ConsoleSessionRecord, utcnow


def hash_session_id(session_id: str) -> str:
    """The stored form of a session id (hex SHA-256: the id is 32 random bytes, so no salt is needed)."""
    return hashlib.sha256(session_id.encode()).hexdigest()


def record_session(
    session: Session,
    session_id: str,
    role: str,
    expires_at: datetime,
    *,
    tenant_id: str | None = None,
    api_key_id: str | None = None,
) -> ConsoleSessionRecord:
    """Record a new signed-in session (and delete the ended ones of everybody); the caller commits."""
    now = utcnow()
    delete_ended_sessions(session, now)
    row = ConsoleSessionRecord(
        session_id_hash=hash_session_id(session_id),
        role=role,
        tenant_id=tenant_id,
        api_key_id=api_key_id,
        created_at=now,
        expires_at=expires_at,
    )
    session.add(row)
    session.flush()
    return row


def find_live_session(
    session: Session, session_id: str, now: datetime | None = None
) -> ConsoleSessionRecord | None:
    """The session's row while it is neither revoked nor expired, else None."""
    row = session.get(ConsoleSessionRecord, hash_session_id(session_id))
    if row is None or row.revoked_at is not None or row.expires_at <= (now or utcnow()):
        return None
    return row


def revoke_session(session: Session, session_id: str) -> bool:
    """End a session (sign-out); True when a live row was revoked. The caller commits."""
    result = session.execute(
        update(ConsoleSessionRecord)
        .where(ConsoleSessionRecord.session_id_hash == hash_session_id(session_id))
        .where(ConsoleSessionRecord.revoked_at.is_(None))
        .values(revoked_at=utcnow())
    )
    return bool(getattr(result, "rowcount", 0))


def delete_ended_sessions(session: Session, now: datetime | None = None) -> int:
    """Delete the rows of sessions that expired or were revoked; returns how many. The caller commits."""
    result = session.execute(
        delete(ConsoleSessionRecord).where(
            or_(
                ConsoleSessionRecord.expires_at <= (now or utcnow()),
                ConsoleSessionRecord.revoked_at.is_not(None),
            )
        )
    )
    return int(getattr(result, "rowcount", 0))
