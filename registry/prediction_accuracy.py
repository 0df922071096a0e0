"""How good the served output-length predictions were, from the usage ledger (GET /v1/admin/predictor).

Over the `ok` rows that started in [start, end) and carry a prediction, per adapter version (the predictor's
key; None: the base model) and overall: the number of requests, the MAE in tokens between
predicted_output_tokens and the true completion_tokens, and the bucket accuracy (both in the same
scheduler.length_predictor.BUCKET_EDGES class), the metrics the training job reports on its held-out split.
Aggregated in SQL (one GROUP BY, exact integer sums), so a long window never loads its rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Integer, case, func, select
from sqlalchemy.orm import Session

from registry.models import UsageRecord
from scheduler.length_predictor import BUCKET_EDGES

JUDGED_STATUS = "ok"  # finished: completion_tokens is the true output length


@dataclass(frozen=True)
class PredictionAccuracy:
    """Accuracy of one group's predictions (mae and bucket_accuracy are None without samples)."""

    num_samples: int
    mae: float | None
    bucket_accuracy: float | None
    adapter_version_id: str | None = None
    adapter_id: str | None = None
    model_name: str | None = None


def _bucket(column: Any) -> Any:
    """The BUCKET_EDGES class of a token count, as SQL (scheduler.length_predictor.length_bucket)."""
    return case(*[(column < edge, index) for index, edge in enumerate(BUCKET_EDGES)], else_=len(BUCKET_EDGES))


def _accuracy(num: int, abs_error: int, hits: int, **group: Any) -> PredictionAccuracy:
    if not num:
        return PredictionAccuracy(0, None, None, **group)
    return PredictionAccuracy(num, abs_error / num, hits / num, **group)


def prediction_accuracy(
    session: Session, start: datetime, end: datetime
) -> tuple[PredictionAccuracy, list[PredictionAccuracy]]:
    """(overall, per adapter version sorted by most samples first) for rows started in [start, end)."""
    predicted, true = UsageRecord.predicted_output_tokens, UsageRecord.completion_tokens
    num = func.count()
    abs_error = func.sum(func.abs(predicted - true))
    hits = func.sum(case((_bucket(predicted) == _bucket(true), 1), else_=0), type_=Integer)
    query = (
        select(
            UsageRecord.adapter_version_id,
            func.max(UsageRecord.adapter_id),
            func.max(UsageRecord.model_name),
            num,
            abs_error,
            hits,
        )
        .where(
            UsageRecord.status == JUDGED_STATUS,
            UsageRecord.predicted_output_tokens.is_not(None),
            UsageRecord.started_at >= start,
            UsageRecord.started_at < end,
        )
        .group_by(UsageRecord.adapter_version_id)
    )
    rows = [
        (key, adapter_id, name, int(n), int(err or 0), int(hit or 0))
        for key, adapter_id, name, n, err, hit in session.execute(query)
    ]
    groups = [
        _accuracy(n, err, hit, adapter_version_id=key, adapter_id=adapter_id, model_name=name)
        for key, adapter_id, name, n, err, hit in rows
    ]
    groups.sort(key=lambda g: (-g.num_samples, g.adapter_version_id or ""))
    overall = _accuracy(sum(r[3] for r in rows), sum(r[4] for r in rows), sum(r[5] for r in rows))
    return overall, groups
