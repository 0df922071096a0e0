"""Console session cookies and CSRF tokens: signed, expiring, bound to one session."""

from __future__ import annotations

import pytest

from api.console.session import (
    OPERATOR,
    SESSION_COOKIE,
    TENANT,
    csrf_token,
    decode_session,
    derive_console_secret,
    encode_session,
    is_csrf_valid,
    is_login_csrf_valid,
    login_csrf_token,
    new_login_nonce,
    new_session,
)
from registry.keys import format_key
from tests.api.console.console_support import assert_holds_no_key

SECRET = b"s" * 32


def test_a_session_round_trips_and_expires() -> None:
    session = new_session(TENANT, 60, key_id="k1")
    value = encode_session(session, SECRET)
    assert decode_session(value, SECRET) == session
    assert decode_session(value, SECRET, now_s=session.expires_at_s + 1) is None


def test_a_session_signed_with_another_secret_or_altered_is_refused() -> None:
    value = encode_session(new_session(OPERATOR, 60, admin_fingerprint="f"), SECRET)
    assert decode_session(value, b"t" * 32) is None
    payload, _, signature = value.rpartition(".")
    assert (
        decode_session(payload[:-1] + ("A" if payload[-1] != "A" else "B") + "." + signature, SECRET) is None
    )
    for junk in (None, "", "no-dot", ".", "a.b.c"):
        assert decode_session(junk, SECRET) is None


def test_csrf_tokens_are_per_session() -> None:
    one, two = new_session(TENANT, 60, key_id="k"), new_session(TENANT, 60, key_id="k")
    assert is_csrf_valid(one, SECRET, csrf_token(one, SECRET))
    assert not is_csrf_valid(one, SECRET, csrf_token(two, SECRET))
    assert not is_csrf_valid(one, SECRET, None)


def test_the_secret_is_configured_else_derived_from_the_admin_key_else_random() -> None:
    assert derive_console_secret("x", "admin") == derive_console_secret("x", "other")
    assert derive_console_secret(None, "admin") == derive_console_secret(None, "admin")
    assert derive_console_secret(None, "admin") != derive_console_secret(None, "other")
    assert derive_console_secret(None, None) != derive_console_secret(None, None)


def test_a_sign_in_token_is_good_only_with_its_nonce_and_secret() -> None:
    nonce = new_login_nonce()
    token = login_csrf_token(nonce, SECRET)
    assert token != nonce and is_login_csrf_valid(nonce, SECRET, token)
    assert not is_login_csrf_valid(new_login_nonce(), SECRET, token)
    assert not is_login_csrf_valid(nonce, b"t" * 32, token)
    assert not is_login_csrf_valid(nonce, SECRET, nonce)  # the old double-submit: the cookie's own value
    assert not is_login_csrf_valid(None, SECRET, token) and not is_login_csrf_valid(nonce, SECRET, None)


def test_holds_no_key_check_does_not_depend_on_the_keys_random_content() -> None:
    """A secret ending in `_x` (token_urlsafe may give one): the check looks for the parsed secret, not for what
    follows the key's last `_` (an `x` that a cookie may well contain)."""
    key = format_key("k1", "A" * 40 + "_x")
    cookie = encode_session(new_session(TENANT, 60, key_id="k1"), SECRET)
    header = f"{SESSION_COOKIE}={cookie}; HttpOnly; Max-Age=60; Path=/console; SameSite=strict"
    assert key.split("_")[-1] in header  # what the old check looked for: it failed on this cookie
    assert_holds_no_key(header, key)
    leaked = encode_session(new_session(TENANT, 60, key_id=key), SECRET)
    with pytest.raises(AssertionError):
        assert_holds_no_key(f"{SESSION_COOKIE}={leaked}; HttpOnly", key)
