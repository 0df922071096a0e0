"""Content digests of adapter files (pure: hashlib only; the registry and the workers share them).

An adapter version is two files: adapter_config.json (rank, lora_alpha, targets) and
adapter_model.safetensors. Anything that caches a version's files or what was built from them must be
keyed by both, since two versions can have identical weights and different configs: `adapter_content_digest`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

HASH_CHUNK_BYTES = 4 * 1024 * 1024
_CONTENT_DIGEST_DOMAIN = b"lorahost-adapter-content-v1"


def sha256_file(path: Path, chunk_bytes: int = HASH_CHUNK_BYTES) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def adapter_content_digest(weights_sha256: str, config_sha256: str) -> str:
    """Hex sha256 identifying an adapter by both its files (weights and config hex digests)."""
    if not weights_sha256 or not config_sha256:
        raise ValueError("both the weights and the config sha256 are needed for an adapter content digest")
    digest = hashlib.sha256(_CONTENT_DIGEST_DOMAIN)
    for part in (weights_sha256, config_sha256):
        digest.update(b"\0" + part.lower().encode())
    return digest.hexdigest()


def owner_scoped_digest(content_digest: str, owner_id: str) -> str:
    """Hex sha256 of an adapter's content digest within one owner's scope: identical files of two owners
    get two different digests (a cache keyed by it never shares an entry between tenants)."""
    if not owner_id:
        raise ValueError("an owner id is needed for an owner-scoped digest")
    digest = hashlib.sha256(_CONTENT_DIGEST_DOMAIN + b"\0owner")
    for part in (content_digest.lower(), owner_id):
        digest.update(b"\0" + part.encode())
    return digest.hexdigest()
