"""The length predictor's artifact format: a header, then one JSON document of plain data.

    b"LHLENPRED" + UTF-8 JSON {"format_version": 3, "model_version", "model_kind", "num_training_samples",
                               "config": {...}, "model": null | {"kind": ...} (scheduler/length/length_models.py),
                               "histories": [[tenant id, adapter id, [lengths...], ewma], ...]}

Reading it parses JSON only: nothing in an artifact is executed (a blob store is shared infrastructure, so a
stored model must not be a way to run code in every API process). Formats 1 and 2 were pickles; `decode`
refuses them without unpickling ("retrain to replace it"), like any other artifact it cannot use. Every
refusal is a `PredictorArtifactError`; the API then keeps serving what it served (the prior until a model
loads) and logs the error, as for a missing artifact (api/inference/learned_predictor.py).

Tenant and adapter ids are JSON scalars (str, int or None); a history key is (tenant id, adapter id).
"""

from __future__ import annotations

import json
from typing import Any

ARTIFACT_MAGIC = b"LHLENPRED"
# 2: histories keyed by (tenant, adapter) and no prompt-text features; 3: JSON instead of a pickle.
ARTIFACT_FORMAT_VERSION = 3
PICKLE_PROTOCOL_2_TO_5 = b"\x80"  # the first byte of a pickle of protocol 2 or later (formats 1 and 2)
STATE_KEYS = frozenset(
    {"format_version", "model_version", "model_kind", "num_training_samples", "config", "model", "histories"}
)


class PredictorArtifactError(ValueError):
    """A predictor artifact that cannot be used (empty, corrupt, a pickle, another format version)."""


def encode(state: dict[str, Any]) -> bytes:
    """The artifact of `state` (STATE_KEYS but format_version; plain data); TypeError when a history key is
    not made of JSON scalars."""
    for key in state["histories"]:
        if not all(part is None or isinstance(part, str | int) for part in key[:2]):
            raise TypeError(f"history key {key[:2]!r}: tenant and adapter ids must be str, int or None")
    document = {"format_version": ARTIFACT_FORMAT_VERSION, **state}
    return ARTIFACT_MAGIC + json.dumps(document, separators=(",", ":")).encode()


def decode(data: bytes) -> dict[str, Any]:
    """The state of an artifact written by `encode`; PredictorArtifactError says why one cannot be used."""
    if not data:
        raise PredictorArtifactError("length predictor artifact is empty")
    if not data.startswith(ARTIFACT_MAGIC):
        raise PredictorArtifactError("not a length predictor artifact (bad header)")
    body = data[len(ARTIFACT_MAGIC) :]
    if body.startswith(PICKLE_PROTOCOL_2_TO_5):
        raise PredictorArtifactError(
            "length predictor artifact is a pickle (format version 2 or older), which this build does not load "
            f"(unpickling can run code); it reads format version {ARTIFACT_FORMAT_VERSION} (retrain to replace it)"
        )
    try:
        state = json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        raise PredictorArtifactError(f"length predictor artifact is corrupt: {error!r}") from error
    if not isinstance(state, dict):
        raise PredictorArtifactError("length predictor artifact is corrupt: not a JSON object")
    if state.get("format_version") != ARTIFACT_FORMAT_VERSION:
        raise PredictorArtifactError(
            f"length predictor artifact has format version {state.get('format_version')!r}; "
            f"this build reads {ARTIFACT_FORMAT_VERSION} (retrain to replace it)"
        )
    if missing := STATE_KEYS - set(state):
        raise PredictorArtifactError(f"length predictor artifact is malformed: no {sorted(missing)}")
    return state
