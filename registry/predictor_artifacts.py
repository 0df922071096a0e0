"""Length predictor artifacts in the blob store: versioned models, their metadata and a pointer to the newest.

Layout (keys):
  predictors/length/<version>.bin   LengthPredictor.to_bytes() (scheduler/length/length_predictor_artifact.py: JSON)
  predictors/length/<version>.json  metadata: version, trained_at, sample counts, held-out metrics
  predictors/length/current         the pointer: {"version", "artifact_key", "metadata_key"}
The training job (registry/predictor_training.py) writes the model, then its metadata, then the pointer, so
a reader that follows the pointer never finds a half-written model (each blob is itself written atomically:
registry/storage.py). Readers (api/inference/learned_predictor.py) poll the small pointer and fetch a model
only when its version changed. Only the newest NUM_KEPT_VERSIONS versions are kept.
"""

from __future__ import annotations

import io
import json
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from registry.storage import BlobNotFoundError, BlobStore
from scheduler.length.length_predictor_artifact import PredictorArtifactError

PREFIX = "predictors/length/"
POINTER_KEY = f"{PREFIX}current"
NUM_KEPT_VERSIONS = 3


@dataclass(frozen=True)
class PredictorPointer:
    """Where the newest length predictor lives."""

    version: str
    artifact_key: str
    metadata_key: str


def new_version(now: datetime) -> str:
    """A version id that sorts by training time: 20261127T060000Z-1a2b3c4d."""
    return f"{now:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"


def artifact_keys(version: str) -> tuple[str, str]:
    """(model key, metadata key) of a version."""
    return f"{PREFIX}{version}.bin", f"{PREFIX}{version}.json"


def write_predictor(
    store: BlobStore, version: str, artifact: bytes, metadata: dict[str, Any]
) -> PredictorPointer:
    """Store a model and its metadata, then point `current` at them (last); then drop versions beyond
    NUM_KEPT_VERSIONS. Returns the new pointer."""
    artifact_key, metadata_key = artifact_keys(version)
    store.put_stream(artifact_key, io.BytesIO(artifact))
    store.put_stream(metadata_key, io.BytesIO(json.dumps(metadata).encode()))
    pointer = PredictorPointer(version, artifact_key, metadata_key)
    store.put_stream(POINTER_KEY, io.BytesIO(json.dumps(asdict(pointer)).encode()))
    prune_versions(store, keep=version)
    return pointer


def prune_versions(store: BlobStore, keep: str) -> list[str]:
    """Delete the blobs of all but the newest NUM_KEPT_VERSIONS versions (never `keep`); returns the keys."""
    versions = sorted(
        {key.removeprefix(PREFIX).rsplit(".", 1)[0] for key in store.list_keys(PREFIX) if key != POINTER_KEY}
    )
    old = [v for v in versions[:-NUM_KEPT_VERSIONS] if v != keep]
    deleted = [key for v in old for key in artifact_keys(v)]
    for key in deleted:
        store.delete(key)
    return deleted


def read_blob(store: BlobStore, key: str) -> bytes:
    """A whole (small) blob; BlobNotFoundError when missing."""
    with store.open(key) as stream:
        return bytes(stream.read())


def read_pointer(store: BlobStore) -> PredictorPointer:
    """The current pointer; BlobNotFoundError (none trained yet) or PredictorArtifactError (unreadable)."""
    data = read_blob(store, POINTER_KEY)
    try:
        values = json.loads(data)
        return PredictorPointer(
            str(values["version"]), str(values["artifact_key"]), str(values["metadata_key"])
        )
    except (ValueError, KeyError, TypeError) as error:
        raise PredictorArtifactError(f"length predictor pointer is corrupt: {error!r}") from error


def read_metadata(store: BlobStore, pointer: PredictorPointer) -> dict[str, Any]:
    """A version's metadata; PredictorArtifactError when it is missing or not a JSON object."""
    try:
        values = json.loads(read_blob(store, pointer.metadata_key))
    except (BlobNotFoundError, ValueError) as error:
        raise PredictorArtifactError(f"length predictor metadata is unreadable: {error!r}") from error
    if not isinstance(values, dict):
        raise PredictorArtifactError("length predictor metadata is not a JSON object")
    return values
