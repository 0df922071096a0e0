"""API keys: create (the only time a key exists in clear), find by presented key (constant-time check),
list and revoke; a tenant's own revocation is scoped to its keys."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from registry import keys
from registry.errors import NotFoundError
from registry.models import ApiKey, utcnow
from registry.repository import get_tenant


def create_api_key(session: Session, tenant_id: str) -> tuple[ApiKey, str]:
    """Create a key for the tenant; returns the row and the full key (the only time it exists in clear)."""
    get_tenant(session, tenant_id)
    secret, salt = keys.new_secret(), keys.new_salt()
    row = ApiKey(tenant_id=tenant_id, salt=salt, secret_hash=keys.hash_secret(secret, salt))
    session.add(row)
    session.flush()
    return row, keys.format_key(row.id, secret)


def revoke_api_key(session: Session, key_id: str) -> ApiKey:
    """Mark a key revoked (idempotent)."""
    row = session.get(ApiKey, key_id)
    if row is None:
        raise NotFoundError(f"API key {key_id!r} does not exist")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        session.flush()
    return row


def list_api_keys(session: Session, tenant_id: str) -> list[ApiKey]:
    """The tenant's keys (revoked ones too), newest first."""
    query = select(ApiKey).where(ApiKey.tenant_id == tenant_id)
    return list(session.scalars(query.order_by(ApiKey.created_at.desc(), ApiKey.id)))


def revoke_own_api_key(session: Session, tenant_id: str, key_id: str) -> ApiKey:
    """Revoke one of the tenant's own keys; another tenant's key is NotFoundError, as if it did not exist."""
    row = session.get(ApiKey, key_id)
    if row is None or row.tenant_id != tenant_id:
        raise NotFoundError(f"API key {key_id!r} does not exist")
    return revoke_api_key(session, key_id)


def find_api_key(session: Session, presented: str) -> ApiKey | None:
    """The unrevoked key row matching a presented bearer key (secret checked in constant time), else None.

    The caller still checks `row.tenant.is_active`.
    """
    parsed = keys.parse_key(presented)
    if parsed is None:
        return None
    row = session.get(ApiKey, parsed.key_id)
    if row is None or row.revoked_at is not None:
        return None
    if not keys.verify_secret(parsed.secret, row.salt, row.secret_hash):
        return None
    return row
