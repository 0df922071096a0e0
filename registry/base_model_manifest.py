"""A catalog model's manifest in the blob store (`models/<name>/manifest.json`): its files with their digests and
blob keys. `lorahost models add` writes it after every file is stored (registry/base_model_catalog.py); a worker
reads it by the model's name and fetches the files (gpu_workers/worker/base_model_fetch.py), so workers need no
database and no model volume."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

BLOB_PREFIX = "models"


@dataclass(frozen=True)
class ModelFile:
    """One file of a base model: its name in the model directory, digest, size and blob key."""

    path: str
    sha256: str
    num_bytes: int
    blob_key: str


def manifest_key(name: str) -> str:
    """The blob key of model `name`'s manifest."""
    return f"{BLOB_PREFIX}/{name}/manifest.json"


def file_key(name: str, sha256: str, path: str) -> str:
    """The content-addressed blob key of one file of model `name`."""
    return f"{BLOB_PREFIX}/{name}/{sha256}/{path}"


def dump_manifest(name: str, files: list[ModelFile]) -> bytes:
    """The manifest's JSON bytes."""
    return json.dumps({"name": name, "files": [asdict(f) for f in files]}, indent=1).encode()


def parse_manifest(raw: bytes) -> tuple[str, list[ModelFile]]:
    """(name, files) of a manifest; ValueError naming what is wrong when it is not one."""
    try:
        body = json.loads(raw)
        files = [
            ModelFile(str(f["path"]), str(f["sha256"]), int(f["num_bytes"]), str(f["blob_key"]))
            for f in body["files"]
        ]
        name = str(body["name"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"not a base-model manifest: {exc!r}") from exc
    if not files or any("/" in f.path or f.path in ("", ".", "..") for f in files):
        raise ValueError("a base-model manifest lists plain file names, at least one")
    return name, files
