"""API keys: create (the only time a key exists in clear), find by presented key (constant-time check),
and revoke (the list: registry/account_pages.py); a tenant's own revocation is scoped to its keys.

A tenant holds at most `max_live_keys` unrevoked keys (settings.api.max_keys_per_tenant, for the tenant's and
the operator's creations alike), and a tenant cannot revoke its own last live key (it would lock itself out
of the API and the console; the operator still can). Both are checked after locking the tenant's row, so
concurrent creations or revocations of one tenant count in turn."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from registry import keys
from registry.errors import ConflictError, NotFoundError
from registry.models import ApiKey, Tenant, utcnow


def create_api_key(
    session: Session, tenant_id: str, *, max_live_keys: int | None = None
) -> tuple[ApiKey, str]:
    """Create a key for the tenant; returns the row and the full key (the only time it exists in clear).

    ConflictError (`key_limit_reached`) when the tenant already holds `max_live_keys` live keys."""
    _lock_tenant(session, tenant_id)
    num_live = num_live_keys(session, tenant_id)
    if max_live_keys is not None and num_live >= max_live_keys:
        raise ConflictError(
            f"this tenant holds {num_live} live API keys, the limit is {max_live_keys} "
            "(LORAHOST_MAX_KEYS_PER_TENANT): revoke a key that is no longer used, then create the new one",
            code="key_limit_reached",
        )
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


def revoke_own_api_key(session: Session, tenant_id: str, key_id: str) -> ApiKey:
    """Revoke one of the tenant's own keys; another tenant's key is NotFoundError, as if it did not exist.

    ConflictError (`last_live_key`) for the tenant's last live key: revoking it would lock the tenant out."""
    _lock_tenant(session, tenant_id)
    row = session.get(ApiKey, key_id)
    if row is None or row.tenant_id != tenant_id:
        raise NotFoundError(f"API key {key_id!r} does not exist")
    if row.revoked_at is None and num_live_keys(session, tenant_id) <= 1:
        raise ConflictError(
            f"API key {key_id!r} is your last live key: revoking it would lock you out of the API and the "
            "console. Create another key first (POST /v1/keys or the console's keys page), then revoke this one",
            code="last_live_key",
        )
    return revoke_api_key(session, key_id)


def num_live_keys(session: Session, tenant_id: str) -> int:
    """How many of the tenant's keys are not revoked."""
    query = select(func.count()).where(ApiKey.tenant_id == tenant_id, ApiKey.revoked_at.is_(None))
    return int(session.scalar(query) or 0)


def _lock_tenant(session: Session, tenant_id: str) -> None:
    """Lock the tenant's row for this transaction (key changes of one tenant then run in turn); NotFoundError
    for an unknown tenant."""
    query = select(Tenant.id).where(Tenant.id == tenant_id).with_for_update(key_share=True)
    if session.execute(query).first() is None:
        raise NotFoundError(f"tenant {tenant_id!r} does not exist")


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
