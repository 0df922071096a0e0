"""How good the served output-length predictions were, from the usage ledger (GET /v1/admin/predictor).

Over the `ok` rows that started in [start, end) and carry a prediction, per adapter version (the predictor's
key; None: the base model) and overall: the number of requests, the MAE in tokens between
predicted_output_tokens and the true completion_tokens, the bucket accuracy (both in the same
scheduler.length.length_predictor.BUCKET_EDGES class), Spearman's rank correlation of predicted and true lengths
and the recall of each true bucket (scheduler/length/length_metrics.py), the metrics the training job reports on
its held-out split. Aggregated in SQL (GROUP BYs with exact integer sums; the ranks by window functions,
ties sharing their mean rank, summed for Pearson's r of the ranks), so a long window never loads its rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Float, Integer, case, cast, func, select
from sqlalchemy.orm import Session

from registry.models import UsageRecord
from scheduler.length.length_metrics import pearson_from_sums, recall_from_counts
from scheduler.length.length_predictor import BUCKET_EDGES

JUDGED_STATUS = "ok"  # finished: completion_tokens is the true output length
NUM_BUCKETS = len(BUCKET_EDGES) + 1
RankSums = tuple[int, float, float, float, float, float]  # n, sum x, sum y, sum xy, sum xx, sum yy
BucketCounts = tuple[list[int], list[int]]  # per true bucket: samples, hits


@dataclass(frozen=True)
class PredictionAccuracy:
    """Accuracy of one group's predictions (mae, bucket_accuracy and spearman are None without samples;
    bucket_recall[b] is None without a true sample in bucket b)."""

    num_samples: int
    mae: float | None
    bucket_accuracy: float | None
    adapter_version_id: str | None = None
    adapter_id: str | None = None
    model_name: str | None = None
    spearman: float | None = None
    bucket_recall: tuple[float | None, ...] = ()
    bucket_num_samples: tuple[int, ...] = ()


def _bucket(column: Any) -> Any:
    """The BUCKET_EDGES class of a token count, as SQL (scheduler.length.length_predictor.length_bucket)."""
    return case(*[(column < edge, index) for index, edge in enumerate(BUCKET_EDGES)], else_=len(BUCKET_EDGES))


def _judged(start: datetime, end: datetime) -> tuple[Any, ...]:
    """The rows judged: finished ok, with a prediction, started in [start, end)."""
    return (
        UsageRecord.status == JUDGED_STATUS,
        UsageRecord.predicted_output_tokens.is_not(None),
        UsageRecord.started_at >= start,
        UsageRecord.started_at < end,
    )


def _mean_rank(column: Any, *partition: Any) -> Any:
    """1-based rank of `column` within `partition`, ties sharing the mean of the ranks they span."""
    first = func.rank().over(partition_by=list(partition) or None, order_by=column)
    num_tied = func.count().over(partition_by=[*partition, column])
    return cast(first, Float) + cast(num_tied - 1, Float) / 2.0


def _rank_sum_columns(x: Any, y: Any) -> tuple[Any, ...]:
    return (func.count(), func.sum(x), func.sum(y), func.sum(x * y), func.sum(x * x), func.sum(y * y))


def _as_sums(row: Any) -> RankSums:
    n, sx, sy, sxy, sxx, syy = row
    return int(n), float(sx or 0), float(sy or 0), float(sxy or 0), float(sxx or 0), float(syy or 0)


def _rank_sums(
    session: Session, start: datetime, end: datetime
) -> tuple[RankSums, dict[str | None, RankSums]]:
    """Sums of the predicted and true lengths' ranks: over all judged rows, and per adapter version."""
    predicted, true = UsageRecord.predicted_output_tokens, UsageRecord.completion_tokens
    key = UsageRecord.adapter_version_id
    ranked = (
        select(
            key.label("key"),
            _mean_rank(predicted, key).label("gx"),
            _mean_rank(true, key).label("gy"),
            _mean_rank(predicted).label("ox"),
            _mean_rank(true).label("oy"),
        )
        .where(*_judged(start, end))
        .subquery()
    )
    c = ranked.c
    per_group = session.execute(select(c.key, *_rank_sum_columns(c.gx, c.gy)).group_by(c.key))
    groups = {row[0]: _as_sums(row[1:]) for row in per_group}
    overall = _as_sums(session.execute(select(*_rank_sum_columns(c.ox, c.oy))).one())
    return overall, groups


def _bucket_counts(session: Session, start: datetime, end: datetime) -> dict[str | None, BucketCounts]:
    """Per adapter version: (true samples, hits) per true bucket."""
    predicted, true = UsageRecord.predicted_output_tokens, UsageRecord.completion_tokens
    true_bucket = _bucket(true)
    hits = func.sum(case((_bucket(predicted) == true_bucket, 1), else_=0), type_=Integer)
    query = (
        select(UsageRecord.adapter_version_id, true_bucket, func.count(), hits)
        .where(*_judged(start, end))
        .group_by(UsageRecord.adapter_version_id, true_bucket)
    )
    counts: dict[str | None, BucketCounts] = {}
    for key, bucket, num, num_hits in session.execute(query):
        num_true, num_hit = counts.setdefault(key, ([0] * NUM_BUCKETS, [0] * NUM_BUCKETS))
        num_true[int(bucket)] += int(num)
        num_hit[int(bucket)] += int(num_hits or 0)
    return counts


def _accuracy(
    num: int, abs_error: int, rank_sums: RankSums | None, counts: BucketCounts | None, **group: Any
) -> PredictionAccuracy:
    if not num or counts is None:
        return PredictionAccuracy(0, None, None, **group, bucket_num_samples=(0,) * NUM_BUCKETS)
    num_true, num_hits = counts
    return PredictionAccuracy(
        num,
        abs_error / num,
        sum(num_hits) / num,
        **group,
        spearman=pearson_from_sums(*rank_sums) if rank_sums is not None else None,
        bucket_recall=recall_from_counts(num_true, num_hits),
        bucket_num_samples=tuple(num_true),
    )


def _summed(counts: dict[str | None, BucketCounts]) -> BucketCounts:
    return (
        [sum(c[0][b] for c in counts.values()) for b in range(NUM_BUCKETS)],
        [sum(c[1][b] for c in counts.values()) for b in range(NUM_BUCKETS)],
    )


def prediction_accuracy(
    session: Session, start: datetime, end: datetime
) -> tuple[PredictionAccuracy, list[PredictionAccuracy]]:
    """(overall, per adapter version sorted by most samples first) for rows started in [start, end)."""
    predicted, true = UsageRecord.predicted_output_tokens, UsageRecord.completion_tokens
    query = (
        select(
            UsageRecord.adapter_version_id,
            func.max(UsageRecord.adapter_id),
            func.max(UsageRecord.model_name),
            func.count(),
            func.sum(func.abs(predicted - true)),
        )
        .where(*_judged(start, end))
        .group_by(UsageRecord.adapter_version_id)
    )
    rows = [
        (key, adapter, name, int(n), int(err or 0)) for key, adapter, name, n, err in session.execute(query)
    ]
    overall_ranks, group_ranks = _rank_sums(session, start, end)
    counts = _bucket_counts(session, start, end)
    groups = [
        _accuracy(
            n,
            err,
            group_ranks.get(key),
            counts.get(key),
            adapter_version_id=key,
            adapter_id=adapter,
            model_name=name,
        )
        for key, adapter, name, n, err in rows
    ]
    groups.sort(key=lambda g: (-g.num_samples, g.adapter_version_id or ""))
    total = sum(r[3] for r in rows)
    overall = _accuracy(total, sum(r[4] for r in rows), overall_ranks, _summed(counts))
    return overall, groups
