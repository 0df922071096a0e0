"""Console sessions: a signed cookie after sign-in with an API key, and the CSRF tokens.

The cookie holds no key: only who signed in (an API key's id, or the operator), a random session id and an
expiry, signed with HMAC-SHA256 under the console secret (derive_console_secret). Every request checks the
signature and expiry here; the caller then checks the session's row in the database (registry/console_sessions.py:
not revoked by a sign-out, not expired) and that the key is still unrevoked and its tenant active (a revoked key
ends its sessions at once) or that the operator's key is still the configured one. The CSRF token is an HMAC
of the session id: forms and htmx/fetch requests send it back, a cross-site page cannot read it.

Before sign-in there is no session: the sign-in form's CSRF token is an HMAC of a random nonce kept in a
pre-session cookie (LOGIN_CSRF_COOKIE), so a token is only good with the cookie it was issued for.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

SESSION_COOKIE = "lh_console"
LOGIN_CSRF_COOKIE = "lh_console_login"
OPERATOR = "operator"
TENANT = "tenant"


@dataclass(frozen=True)
class ConsoleSession:
    """Who signed in: a tenant through one of its keys (`key_id`), or the operator (`admin_fingerprint`)."""

    role: str  # TENANT or OPERATOR
    session_id: str  # random; the database keeps only its hash (registry/console_sessions.py)
    expires_at_s: float
    key_id: str | None = None
    admin_fingerprint: str | None = None

    @property
    def is_operator(self) -> bool:
        """True for an operator session."""
        return self.role == OPERATOR


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: bytes, purpose: str, payload: str) -> str:
    return _b64(hmac.new(secret, f"{purpose}:{payload}".encode(), hashlib.sha256).digest())


def new_session(
    role: str, ttl_s: float, *, key_id: str | None = None, admin_fingerprint: str | None = None
) -> ConsoleSession:
    """A fresh session valid for ttl_s seconds (the caller records it: registry/console_sessions.py)."""
    return ConsoleSession(role, secrets.token_urlsafe(32), time.time() + ttl_s, key_id, admin_fingerprint)


def encode_session(session: ConsoleSession, secret: bytes) -> str:
    """The cookie value: base64(JSON).signature."""
    payload = _b64(json.dumps(
        {"r": session.role, "s": session.session_id, "e": session.expires_at_s, "k": session.key_id,
         "a": session.admin_fingerprint},
        separators=(",", ":"),
    ).encode())  # fmt: skip
    return f"{payload}.{_mac(secret, 'session', payload)}"


def decode_session(value: str | None, secret: bytes, now_s: float | None = None) -> ConsoleSession | None:
    """The session of a cookie value; None when absent, forged, malformed or expired."""
    if not value or "." not in value:
        return None
    payload, _, signature = value.rpartition(".")
    if not hmac.compare_digest(signature, _mac(secret, "session", payload)):
        return None
    try:
        data = json.loads(_unb64(payload))
        session = ConsoleSession(data["r"], data["s"], float(data["e"]), data.get("k"), data.get("a"))
    except (ValueError, KeyError, TypeError):
        return None
    if session.role not in (TENANT, OPERATOR):
        return None
    return session if session.expires_at_s > (time.time() if now_s is None else now_s) else None


def csrf_token(session: ConsoleSession, secret: bytes) -> str:
    """The session's CSRF token (what every state-changing request must send back)."""
    return _mac(secret, "csrf", session.session_id)


def is_csrf_valid(session: ConsoleSession, secret: bytes, presented: str | None) -> bool:
    """True when `presented` is the session's CSRF token (constant-time)."""
    return presented is not None and hmac.compare_digest(presented, csrf_token(session, secret))


def new_login_nonce() -> str:
    """The random nonce of a pre-session cookie (LOGIN_CSRF_COOKIE)."""
    return secrets.token_urlsafe(24)


def login_csrf_token(nonce: str, secret: bytes) -> str:
    """The sign-in form's CSRF token for the pre-session cookie's nonce."""
    return _mac(secret, "login-csrf", nonce)


def is_login_csrf_valid(nonce: str | None, secret: bytes, presented: str | None) -> bool:
    """True when `presented` is the token of the pre-session cookie's nonce (constant-time)."""
    if not nonce or presented is None:
        return False
    return hmac.compare_digest(presented, login_csrf_token(nonce, secret))


def admin_fingerprint(secret: bytes, admin_credential: str) -> str:
    """A tag of the configured admin key (or its stored hash): operator sessions end when the key changes."""
    return _mac(secret, "admin", admin_credential)


def derive_console_secret(configured: str | None, admin_credential: str | None) -> bytes:
    """The signing secret: settings.api.console_secret; else derived from the admin key (or its stored hash),
    the same on every API replica; else random for this process (sessions end when it restarts)."""
    if configured:
        return hashlib.sha256(f"lorahost-console:{configured}".encode()).digest()
    if admin_credential:
        return hashlib.sha256(f"lorahost-console-derived:{admin_credential}".encode()).digest()
    return secrets.token_bytes(32)
