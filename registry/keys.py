"""API key secrets: generation, salted hashing and constant-time verification.

A tenant key reads `lh_<key id>_<secret>`. The database keeps the key id, a random per-key salt and
HMAC-SHA256(salt, secret); the secret itself is shown once and never stored.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

KEY_PREFIX = "lh"
ADMIN_KEY_PREFIX = "lhadmin"


@dataclass(frozen=True)
class ParsedKey:
    """A tenant key split into its public id and its secret."""

    key_id: str
    secret: str


def new_secret() -> str:
    """A fresh 256-bit URL-safe secret."""
    return secrets.token_urlsafe(32)


def new_salt() -> str:
    """A fresh per-key salt (hex)."""
    return secrets.token_hex(16)


def hash_secret(secret: str, salt: str) -> str:
    """HMAC-SHA256 of the secret keyed by the salt (hex). Secrets are high-entropy, so no KDF is needed."""
    return hmac.new(salt.encode(), secret.encode(), hashlib.sha256).hexdigest()


def verify_secret(secret: str, salt: str, expected_hash: str) -> bool:
    """Constant-time check of a presented secret against a stored hash."""
    return hmac.compare_digest(hash_secret(secret, salt), expected_hash)


def format_key(key_id: str, secret: str) -> str:
    """The full bearer key shown to the tenant once."""
    return f"{KEY_PREFIX}_{key_id}_{secret}"


def parse_key(key: str) -> ParsedKey | None:
    """Split `lh_<id>_<secret>`; None when the key is not of that shape."""
    parts = key.split("_", 2)
    if len(parts) != 3 or parts[0] != KEY_PREFIX or not parts[1] or not parts[2]:
        return None
    return ParsedKey(key_id=parts[1], secret=parts[2])


def new_admin_key() -> str:
    """A fresh admin bearer key (printed once by `lorahost serve`)."""
    return f"{ADMIN_KEY_PREFIX}_{new_secret()}"


def hash_admin_key(key: str) -> str:
    """Storable hash of an admin key, `sha256$<salt>$<hmac>`."""
    salt = new_salt()
    return f"sha256${salt}${hash_secret(key, salt)}"


def verify_admin_key(presented: str, *, admin_key: str | None, admin_key_hash: str | None) -> bool:
    """True when `presented` matches the configured admin key (clear, from settings) or its stored hash."""
    if admin_key:
        return hmac.compare_digest(presented.encode(), admin_key.encode())
    if admin_key_hash:
        scheme, _, rest = admin_key_hash.partition("$")
        salt, _, digest = rest.partition("$")
        return scheme == "sha256" and verify_secret(presented, salt, digest)
    return False


ADMIN_KEY_HASH_FILENAME = "admin_key.sha256"


def read_admin_key_hash(data_dir: Path) -> str | None:
    """The stored admin key hash in data_dir, or None when none was generated."""
    path = Path(data_dir) / ADMIN_KEY_HASH_FILENAME
    return path.read_text().strip() if path.exists() else None


def ensure_admin_key_hash(data_dir: Path) -> str | None:
    """Generate an admin key on first start: store only its hash; return the key (to print once) or None."""
    if read_admin_key_hash(data_dir) is not None:
        return None
    key = new_admin_key()
    path = Path(data_dir) / ADMIN_KEY_HASH_FILENAME
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(hash_admin_key(key) + "\n")
    return key
