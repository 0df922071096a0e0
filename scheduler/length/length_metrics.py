"""What scheduling needs to know about output-length predictions, beyond MAE and bucket accuracy.

When ~90% of outputs fall in the smallest bucket, a predictor that always says "short" scores ~0.9 bucket
accuracy and orders nothing (issue 22 item 5: 0.85-0.89 on a code-completion trace). A size-ordering policy
(SJF, the multi-queue classes) needs the predictions to *rank* requests like their true lengths, and each
class to be recognised when it occurs. So beside MAE and bucket accuracy:
- `spearman`: Spearman's rank correlation of predicted vs true lengths (Pearson's r of the ranks, ties
  given their average rank): 1 = the same order, 0 = no relation; None with fewer than 2 samples or when
  either side is constant (an order of nothing);
- `bucket_recall[b]`: of the requests whose true length is in bucket b, the share predicted in bucket b
  (None for a bucket with no true sample), with `bucket_num_samples[b]`, how many there were.
Buckets: b = the number of `edges` <= the length (lengths below edges[0] are bucket 0). Plain numbers in,
numbers out; `pearson_from_sums` also serves a database that aggregates the ranks' sums itself.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LengthMetrics:
    """Accuracy of predicted output lengths (module doc); mae and bucket_accuracy None without samples."""

    num_samples: int
    mae: float | None
    bucket_accuracy: float | None
    spearman: float | None
    bucket_recall: tuple[float | None, ...]
    bucket_num_samples: tuple[int, ...]

    def as_dict(self) -> dict[str, object]:
        """JSON-ready fields (tuples as lists)."""
        return {
            "num_samples": self.num_samples,
            "mae": self.mae,
            "bucket_accuracy": self.bucket_accuracy,
            "spearman": self.spearman,
            "bucket_recall": list(self.bucket_recall),
            "bucket_num_samples": list(self.bucket_num_samples),
        }


def bucket_of(num_tokens: float, edges: Sequence[int]) -> int:
    """The bucket of a length: how many edges are <= it."""
    return bisect.bisect_right(edges, num_tokens)


def average_ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks of `values`, ties sharing the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            ranks[order[position]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def pearson_from_sums(
    num: int, sum_x: float, sum_y: float, sum_xy: float, sum_xx: float, sum_yy: float
) -> float | None:
    """Pearson's r from the sums of x, y, xy, x^2 and y^2 over `num` pairs; None when num < 2 or a side is
    constant."""
    if num < 2:
        return None
    cov = num * sum_xy - sum_x * sum_y
    var_x = num * sum_xx - sum_x * sum_x
    var_y = num * sum_yy - sum_y * sum_y
    if var_x <= 1e-9 * max(1.0, num * sum_xx) or var_y <= 1e-9 * max(1.0, num * sum_yy):
        return None
    return max(-1.0, min(1.0, cov / math.sqrt(var_x * var_y)))


def spearman(predicted: Sequence[float], true: Sequence[float]) -> float | None:
    """Spearman's rank correlation of two equally long sequences (module doc)."""
    if len(predicted) != len(true):
        raise ValueError(f"spearman needs equally long sequences, got {len(predicted)} and {len(true)}")
    x, y = average_ranks(predicted), average_ranks(true)
    return pearson_from_sums(
        len(x),
        sum(x),
        sum(y),
        sum(a * b for a, b in zip(x, y, strict=True)),
        sum(a * a for a in x),
        sum(b * b for b in y),
    )


def recall_from_counts(num_true: Sequence[int], num_hits: Sequence[int]) -> tuple[float | None, ...]:
    """Per bucket: hits / true samples, None for a bucket without true samples."""
    return tuple(h / n if n else None for n, h in zip(num_true, num_hits, strict=True))


def length_metrics(pairs: Sequence[tuple[int, int]], edges: Sequence[int]) -> LengthMetrics:
    """All the metrics of (predicted, true) length pairs under bucket `edges`."""
    num_buckets = len(edges) + 1
    num_true, num_hits = [0] * num_buckets, [0] * num_buckets
    for predicted, true in pairs:
        bucket = bucket_of(true, edges)
        num_true[bucket] += 1
        num_hits[bucket] += bucket_of(predicted, edges) == bucket
    num = len(pairs)
    return LengthMetrics(
        num_samples=num,
        mae=sum(abs(p - t) for p, t in pairs) / num if num else None,
        bucket_accuracy=sum(num_hits) / num if num else None,
        spearman=spearman([p for p, _ in pairs], [t for _, t in pairs]),
        bucket_recall=recall_from_counts(num_true, num_hits),
        bucket_num_samples=tuple(num_true),
    )
