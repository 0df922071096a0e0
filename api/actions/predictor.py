"""The output-length predictor this API process serves and how accurate the recorded predictions were
(/v1/admin/predictor and the console's predictor page)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from api.errors import ApiError
from api.inference.learned_predictor import describe_predictor
from api.report_schemas import (
    AdapterPredictionAccuracy,
    PredictionAccuracyPublic,
    PredictorModelPublic,
    PredictorReport,
)
from api.services import Services
from registry.models import utcnow
from registry.prediction_accuracy import PredictionAccuracy, prediction_accuracy
from scheduler.length.length_predictor import BUCKET_EDGES

DEFAULT_WINDOW_S = 86400.0
MAX_WINDOW_S = 90 * 86400.0


def check_window_s(window_s: float) -> None:
    """400 unless the window is in (0, MAX_WINDOW_S] seconds."""
    if not 0 < window_s <= MAX_WINDOW_S:
        raise ApiError(
            400, "invalid_request", f"window_s must be in (0, {MAX_WINDOW_S:.0f}] seconds, not {window_s}"
        )


def predictor_report(
    session: Session, services: Services, window_s: float = DEFAULT_WINDOW_S, end_at: datetime | None = None
) -> PredictorReport:
    """The served model (version or "prior", trained_at, held-out metrics of its training) and, from the usage
    rows of requests that finished `ok` and started in the `window_s` seconds before `end_at` (default now),
    the accuracy of their predictions per adapter version and overall."""
    check_window_s(window_s)
    end_at = end_at or utcnow()
    start_at = end_at - timedelta(seconds=window_s)
    overall, groups = prediction_accuracy(session, start_at, end_at)
    return PredictorReport(
        model=served_model(describe_predictor(services.predictor)),
        start=start_at,
        end=end_at,
        bucket_edges=list(BUCKET_EDGES),
        overall=_public(overall),
        data=[
            AdapterPredictionAccuracy(
                **_public(g).model_dump(),
                adapter_version_id=g.adapter_version_id,
                adapter_id=g.adapter_id,
                adapter_name=g.model_name,
            )
            for g in groups
        ],
    )


def _public(accuracy: PredictionAccuracy) -> PredictionAccuracyPublic:
    return PredictionAccuracyPublic(
        num_samples=accuracy.num_samples,
        mae=accuracy.mae,
        bucket_accuracy=accuracy.bucket_accuracy,
        spearman=accuracy.spearman,
        bucket_recall=list(accuracy.bucket_recall),
        bucket_num_samples=list(accuracy.bucket_num_samples),
    )


def served_model(described: dict[str, Any]) -> PredictorModelPublic:
    """The served model's description (api/inference/learned_predictor.describe_predictor) as the response."""
    metadata = described["metadata"]
    heldout = metadata.get("heldout") or {}
    return PredictorModelPublic(
        kind=described["kind"],
        version=described["version"],
        trained_at=metadata.get("trained_at"),
        num_samples=metadata.get("num_samples"),
        num_training_samples=metadata.get("num_training_samples"),
        num_heldout_samples=metadata.get("num_heldout_samples"),
        heldout=heldout.get("overall"),
        heldout_per_adapter=heldout.get("per_adapter", []),
    )
