"""Percentiles of one latency metric in bounded memory, for reports that stream a period's usage rows instead of
holding them (registry/usage_reports.py, registry/usage_series.py).

A sketch is exact (numpy's linear interpolation) while it holds at most MAX_EXACT_VALUES values. Past that it
folds them into a log-bucketed histogram (DDSketch, Masson et al., VLDB 2019): a value x lands in bucket
ceil(log_gamma(x)) with gamma = (1 + a) / (1 - a), and a bucket answers with the point within `a` (relative) of
all its values. numpy interpolates between two order statistics; the sketch interpolates, with the same weight,
between their buckets' values, so a percentile is within RELATIVE_ACCURACY (relative) of numpy's, plus at most
MIN_POSITIVE_MS (values that small count as 0). Memory: at most MAX_EXACT_VALUES floats, then one counter per bucket
between the smallest and largest value seen (~1,250 for 10 ms .. 5 s; never more than ~4,700 over 1 us .. 3 h).
"""

from __future__ import annotations

import math
from array import array

import numpy as np

MAX_EXACT_VALUES = 256  # a report of a few hundred requests per group answers exactly, as before sketches
RELATIVE_ACCURACY = 0.005
MIN_POSITIVE_MS = 1e-3  # values at or below this count as 0 (no latency is measured finer than a microsecond)

_GAMMA = (1 + RELATIVE_ACCURACY) / (1 - RELATIVE_ACCURACY)
_LOG_GAMMA = math.log(_GAMMA)


def bucket_index(value: float) -> int:
    """The bucket of a value > MIN_POSITIVE_MS: gamma**(i-1) < value <= gamma**i."""
    return math.ceil(math.log(value) / _LOG_GAMMA)


def bucket_value(index: int) -> float:
    """The value a bucket answers with: within RELATIVE_ACCURACY of every value in (gamma**(i-1), gamma**i]."""
    return 2 * _GAMMA**index / (_GAMMA + 1)


class LatencySketch:
    """The values of one metric: exact up to MAX_EXACT_VALUES, then log buckets (see the module docstring)."""

    __slots__ = ("_counts", "_exact", "_first_index", "_num_zero", "num_values")

    def __init__(self) -> None:
        self._exact: array[float] | None = array("d")
        self._counts: array[int] = array("q")  # _counts[i] values in bucket _first_index + i
        self._first_index = 0
        self._num_zero = 0  # values <= MIN_POSITIVE_MS (bucketed mode only)
        self.num_values = 0

    def add(self, value: float) -> None:
        """Count one value (ms, >= 0)."""
        self.num_values += 1
        if self._exact is not None:
            self._exact.append(value)
            if len(self._exact) > MAX_EXACT_VALUES:
                values, self._exact = self._exact, None
                for v in values:
                    self._add_bucketed(v)
            return
        self._add_bucketed(value)

    def _add_bucketed(self, value: float) -> None:
        if value <= MIN_POSITIVE_MS:
            self._num_zero += 1
            return
        index = bucket_index(value)
        if not self._counts:
            self._first_index = index
            self._counts.append(0)
        elif index < self._first_index:
            self._counts[0:0] = array("q", bytes(8 * (self._first_index - index)))
            self._first_index = index
        elif index >= self._first_index + len(self._counts):
            self._counts.extend(array("q", bytes(8 * (index - self._first_index - len(self._counts) + 1))))
        self._counts[index - self._first_index] += 1

    @property
    def is_exact(self) -> bool:
        """True while percentiles are exact (no more than MAX_EXACT_VALUES values so far)."""
        return self._exact is not None

    @property
    def num_buckets(self) -> int:
        """Counters held (0 while exact): one per bucket between the smallest and largest value."""
        return len(self._counts)

    def percentile(self, pct: float) -> float | None:
        """The pct-th percentile (0..100), None for no values: numpy's, or within RELATIVE_ACCURACY of it."""
        if self.num_values == 0:
            return None
        if self._exact is not None:
            return float(np.percentile(np.frombuffer(self._exact, dtype=np.float64), pct))
        rank = pct / 100 * (self.num_values - 1)
        lower = self._value_at(math.floor(rank))
        upper = self._value_at(math.ceil(rank))
        return lower + (upper - lower) * (rank - math.floor(rank))

    def _value_at(self, position: int) -> float:
        """The bucket value of the order statistic at 0-based `position`."""
        seen = self._num_zero
        if position < seen:
            return 0.0
        for offset, count in enumerate(self._counts):
            seen += count
            if position < seen:
                return bucket_value(self._first_index + offset)
        return bucket_value(self._first_index + len(self._counts) - 1)
