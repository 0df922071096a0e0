"""The learned output-length predictor of an API process: scheduler.length.length_predictor.LengthPredictor behind
the `OutputLengthPredictor` seam (api/inference/predict.py), hot-reloaded from the blob store.

- `predict` (event loop, per request): the served model's prediction from the request's features and the
  history of its tenant on its adapter (~50 us: a plain-Python tree walk); until a model is loaded, the prior
  (LengthPredictor without a model: that history's median, else max_tokens).
- `observe` (event loop, when a request finishes `ok`: api/metering.py): the true output length goes into
  the history of the request's tenant on its adapter (quantiles + EWMA, features of the model), so
  predictions follow an adapter between trainings. Histories are per (tenant, adapter version), on the
  shared base model and public adapters too: one tenant's traffic never moves another's predictions.
- `reload` (a timer thread started in the app lifespan, every settings.predictor.reload_interval_s, the first
  at startup; never on the request path): reads the pointer (registry/predictor_artifacts.py) and, when it
  names another version, loads that model and its metadata and swaps them in. The new model's histories are
  the artifact's (the training data, cluster-wide) plus what this process observed since the training
  started; (tenant, adapter) pairs the artifact does not know keep their local history. A missing or corrupt pointer,
  model or metadata keeps what is served (the prior until a model loads) and logs one warning naming the key
  and the error (again only when the problem changes).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime
from typing import Any

from api.inference.predict import MaxTokensPredictor, OutputLengthPredictor, PredictionInput
from registry.predictor_artifacts import POINTER_KEY, read_blob, read_metadata, read_pointer
from registry.storage import BlobStore
from scheduler.length.length_predictor import HistoryKey, LengthPredictor, PerAdapterHistory, RequestFeatures
from settings import Settings

log = logging.getLogger(__name__)
PRIOR_VERSION = "prior"
MAX_RECENT_OBSERVATIONS = 10_000  # replayed into a newly loaded model's histories (those since its training)

# (sequence number, wall time s, (tenant id, adapter key), output tokens)
Observation = tuple[int, float, HistoryKey, int]


class LearnedLengthPredictor:
    """The served length model (or the prior), its (tenant, adapter) histories and its hot reload."""

    def __init__(
        self,
        store: BlobStore,
        *,
        max_recent_observations: int = MAX_RECENT_OBSERVATIONS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self._clock = clock
        self._predictor = LengthPredictor()
        self._metadata: dict[str, Any] = {}
        self._lock = threading.Lock()  # the served model and its histories (predict/observe/swap)
        self._reload_lock = threading.Lock()  # one reload at a time (the timer, an inline training)
        self._recent: deque[Observation] = deque(maxlen=max_recent_observations)
        self._num_observed = 0
        self._last_problem: str | None = None

    @property
    def model_version(self) -> str | None:
        """The served model's version; None while serving the prior."""
        return self._metadata.get("version")

    @property
    def metadata(self) -> dict[str, Any]:
        """The served model's training metadata (registry/predictor_training.py); {} for the prior."""
        return dict(self._metadata)

    def history(self, tenant_id: str | None, adapter_key: str | None) -> PerAdapterHistory | None:
        """The tenant's history of true output lengths on the adapter as served now (None: none yet)."""
        return self._predictor.history(tenant_id, adapter_key)

    def predict(self, request: PredictionInput) -> int:
        """The expected output tokens, in [1, max_tokens]."""
        features = RequestFeatures(
            request.adapter_key,
            request.num_prompt_tokens,
            request.max_tokens,
            request.is_chat,
            request.has_stop,
            tenant_id=request.tenant_id,
        )
        with self._lock:
            return self._predictor.predict(features)

    def observe(self, tenant_id: str | None, adapter_key: str | None, num_output_tokens: int) -> None:
        """Record a finished request's true output length in its tenant's history on its adapter."""
        with self._lock:
            self._predictor.observe(tenant_id, adapter_key, num_output_tokens)
            self._num_observed += 1
            self._recent.append(
                (self._num_observed, self._clock(), (tenant_id, adapter_key), num_output_tokens)
            )

    def reload(self) -> bool:
        """Load the newest artifact if its version is not the served one; True when one was swapped in. On any
        failure the served model stays and a warning names the key and the error."""
        with self._reload_lock:
            key = POINTER_KEY
            try:
                pointer = read_pointer(self.store)
                if pointer.version == self.model_version:
                    return False
                key = pointer.artifact_key
                loaded = LengthPredictor.from_bytes(read_blob(self.store, key))
                key = pointer.metadata_key
                metadata = read_metadata(self.store, pointer)
            except Exception as error:  # noqa: BLE001 - missing, corrupt or unreachable: keep serving, say why
                self._warn(key, error)
                return False
            self._swap(loaded, metadata)
            self._last_problem = None
        log.info(
            "length predictor: serving model %s (trained %s on %s requests)",
            self.model_version,
            metadata.get("trained_at"),
            metadata.get("num_samples"),
        )
        return True

    def _swap(self, loaded: LengthPredictor, metadata: dict[str, Any]) -> None:
        """Serve `loaded`: replay this process's observations since its training into the histories it knows
        (most of them outside the lock), keep the local histories of (tenant, adapter) pairs it does not
        know."""
        since_s = _timestamp(metadata.get("trained_at"))
        known = set(loaded.histories)
        with self._lock:
            snapshot = list(self._recent)
        _replay(loaded, snapshot, known, since_s)
        last_seq = snapshot[-1][0] if snapshot else 0
        with self._lock:
            _replay(loaded, [o for o in self._recent if o[0] > last_seq], known, since_s)
            for key, history in self._predictor.histories.items():
                if key not in known:
                    loaded.histories[key] = history
            self._predictor, self._metadata = loaded, metadata

    def _warn(self, key: str, error: BaseException) -> None:
        problem = f"{key}: {error!r}"
        serving = f"model {self.model_version}" if self.model_version else "the prior (no trained model)"
        if problem == self._last_problem:
            log.debug("length predictor: %s still cannot be loaded (%r); serving %s", key, error, serving)
            return
        self._last_problem = problem
        log.warning("length predictor: cannot load %s (%r); serving %s", key, error, serving)


def _replay(
    predictor: LengthPredictor, observations: list[Observation], known: set[Any], since_s: float | None
) -> None:
    for _, at_s, key, num_tokens in observations:
        if key in known and (since_s is None or at_s >= since_s):
            predictor.observe(*key, num_tokens)


def _timestamp(value: object) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def make_length_predictor(settings: Settings, store: BlobStore) -> OutputLengthPredictor:
    """The predictor settings.predictor.length_predictor names (the learned one reloads from `store`)."""
    if settings.predictor.length_predictor == "max_tokens":
        return MaxTokensPredictor()
    return LearnedLengthPredictor(store)


def describe_predictor(predictor: OutputLengthPredictor) -> dict[str, Any]:
    """What an API process serves, for GET /v1/admin/predictor: the kind, the model version ("prior" before a
    model loads; "max_tokens" for that policy), and the model's training metadata."""
    if isinstance(predictor, LearnedLengthPredictor):
        metadata = predictor.metadata
        return {"kind": "learned", "version": predictor.model_version or PRIOR_VERSION, "metadata": metadata}
    if isinstance(predictor, MaxTokensPredictor):
        return {"kind": "max_tokens", "version": "max_tokens", "metadata": {}}
    return {"kind": type(predictor).__name__, "version": "unknown", "metadata": {}}
