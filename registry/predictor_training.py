"""The length predictor's training job: recent finished requests from the usage ledger -> a versioned model
in the blob store (registry/predictor_artifacts.py), hot-reloaded by the API servers
(api/inference/learned_predictor.py).

A training sample is an `ok` usage row (finished by a stop condition or its max_tokens cap, so
completion_tokens is its true output length) that recorded the prediction's inputs (max_tokens, is_chat,
has_stop; rows from before migration 0007 have none and are skipped), keyed like the API keys its
histories: by (tenant id, adapter version id) (None: the base model), so the history features the model is
trained on are what serving computes, one tenant's traffic never in another's history. The prompt enters by
its size (prompt_tokens) only; UsageRecord.prompt_features is neither written nor read. The newest
settings.predictor.max_training_samples rows that started within settings.predictor.training_window_s are
split chronologically: the model is fitted on the older part and judged on the newer HOLDOUT_FRACTION
(MAE and bucket accuracy, overall and per adapter: scheduler.length.length_predictor.evaluate), then the held-out
lengths are fed to its histories, so the shipped model knows each tenant's latest requests on each adapter.
With fewer than settings.predictor.min_training_samples rows nothing is written (a log line says why).

Cluster mode runs `run_predictor_training` from Celery beat (jobs/celery_app.py); with inline jobs the API
runs it on a timer (api/main.py), every settings.jobs.predictor_training_interval_s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from registry.models import UsageRecord, utcnow
from registry.predictor_artifacts import PredictorPointer, new_version, write_predictor
from registry.storage import BlobStore
from scheduler.length.length_predictor import LengthPredictor, LengthSample, RequestFeatures, evaluate
from settings import Settings

log = logging.getLogger(__name__)
HOLDOUT_FRACTION = 0.2
TRAINED_STATUS = "ok"


@dataclass(frozen=True)
class TrainingRun:
    """A finished training: where the model went and what its metadata says."""

    pointer: PredictorPointer
    metadata: dict[str, Any]


def load_length_samples(session: Session, since: datetime, max_samples: int) -> list[LengthSample]:
    """The newest `max_samples` finished requests with recorded features that started at or after `since`, in
    chronological order (by start)."""
    query = (
        select(
            UsageRecord.tenant_id,
            UsageRecord.adapter_version_id,
            UsageRecord.prompt_tokens,
            UsageRecord.max_tokens,
            UsageRecord.is_chat,
            UsageRecord.has_stop,
            UsageRecord.completion_tokens,
        )
        .where(
            UsageRecord.status == TRAINED_STATUS,
            UsageRecord.started_at >= since,
            UsageRecord.max_tokens.is_not(None),
        )
        .order_by(UsageRecord.started_at.desc(), UsageRecord.id.desc())
        .limit(max_samples)
    )
    rows = list(session.execute(query))
    rows.reverse()
    return [
        LengthSample(
            RequestFeatures(
                key, prompt, int(max_tokens or 0), bool(is_chat), bool(has_stop), tenant_id=tenant
            ),
            completion,
        )
        for tenant, key, prompt, max_tokens, is_chat, has_stop, completion in rows
    ]


def chronological_split(
    samples: Sequence[LengthSample], holdout_fraction: float = HOLDOUT_FRACTION
) -> tuple[list[LengthSample], list[LengthSample]]:
    """(older part to fit, newest `holdout_fraction` to judge), each non-empty."""
    if len(samples) < 2:
        raise ValueError(f"a chronological split needs at least 2 samples, got {len(samples)}")
    num_heldout = min(len(samples) - 1, max(1, int(len(samples) * holdout_fraction)))
    return list(samples[:-num_heldout]), list(samples[-num_heldout:])


def train_and_evaluate(
    samples: Sequence[LengthSample], version: str
) -> tuple[LengthPredictor, dict[str, Any]]:
    """Fit on the older part, evaluate on the held-out newer part (scheduler.length.length_predictor.evaluate's
    dict), then feed the held-out lengths to the histories."""
    train, heldout = chronological_split(samples)
    predictor = LengthPredictor().fit(train, model_version=version)
    metrics = evaluate(predictor, heldout)
    for sample in heldout:
        predictor.observe(*sample.features.history_key, sample.num_output_tokens)
    return predictor, metrics


def metrics_json(metrics: dict[str, Any]) -> dict[str, Any]:
    """evaluate()'s dict as JSON: per adapter as a list of {"adapter_key", ...} (None: the base model)."""
    per_adapter = [{"adapter_key": key, **values} for key, values in metrics["per_adapter"].items()]
    per_adapter.sort(key=lambda entry: -entry["num_samples"])
    return {"overall": metrics["overall"], "per_adapter": per_adapter}


def run_predictor_training(
    session_factory: sessionmaker[Session], store: BlobStore, settings: Settings, now: datetime | None = None
) -> TrainingRun | None:
    """One run of the periodic training job; None when it skipped (too few samples: logged)."""
    now = now or utcnow()
    since = now - timedelta(seconds=settings.predictor.training_window_s)
    with session_factory() as session:
        samples = load_length_samples(session, since, settings.predictor.max_training_samples)
    if len(samples) < settings.predictor.min_training_samples:
        log.info(
            "length predictor training skipped: %d finished request(s) with recorded features since %s, fewer than "
            "predictor_min_training_samples=%d; API servers keep the model they serve",
            len(samples),
            since.isoformat(),
            settings.predictor.min_training_samples,
        )
        return None
    started_s = time.perf_counter()
    version = new_version(now)
    predictor, metrics = train_and_evaluate(samples, version)
    num_heldout = int(metrics["overall"]["num_samples"])
    metadata = {
        "version": version,
        "trained_at": now.isoformat(),
        "num_samples": len(samples),
        "num_training_samples": len(samples) - num_heldout,
        "num_heldout_samples": num_heldout,
        "window_s": settings.predictor.training_window_s,
        "model_kind": predictor.model_kind,
        "heldout": metrics_json(metrics),
    }
    pointer = write_predictor(store, version, predictor.to_bytes(), metadata)
    overall = metrics["overall"]
    log.info(
        "trained length predictor %s on %d requests in %.1f s: held-out MAE %.1f tokens, bucket accuracy %.1f%% "
        "(%d requests)",
        version,
        len(samples),
        time.perf_counter() - started_s,
        overall["mae"],
        100 * overall["bucket_accuracy"],
        num_heldout,
    )
    return TrainingRun(pointer, metadata)
