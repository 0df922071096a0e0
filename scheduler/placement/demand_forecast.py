"""Per-adapter demand forecast (tokens/s) from a history of per-bucket token counts. Pure: numbers in and out.

Method: `max(EWMA, last bucket)`. The EWMA over the buckets (oldest first, smoothing `alpha`) remembers an
adapter's recent level, so a quiet bucket does not drop a popular adapter's share at once (placement would
otherwise move it away and back); taking the max with the newest bucket follows a surge within one bucket
(LoRAServe's trend and surge drifts), because under-forecasting a surge overloads its workers while
over-forecasting a decay only leaves a little headroom for a few periods. A history of zeros forecasts 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

DEFAULT_EWMA_ALPHA = 0.5


def ewma(values: Sequence[float], alpha: float = DEFAULT_EWMA_ALPHA) -> float:
    """Exponentially weighted mean of `values` (oldest first), started at the oldest value; 0 for none."""
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], not {alpha}")
    if not values:
        return 0.0
    level = float(values[0])
    for value in values[1:]:
        level = alpha * float(value) + (1 - alpha) * level
    return level


def forecast_rate(
    bucket_tokens: Sequence[float], bucket_s: float, alpha: float = DEFAULT_EWMA_ALPHA
) -> float:
    """Forecast tokens/s for the next period from token counts per `bucket_s`-second bucket (oldest first)."""
    if bucket_s <= 0:
        raise ValueError(f"bucket_s must be positive, not {bucket_s}")
    if not bucket_tokens:
        return 0.0
    return max(ewma(bucket_tokens, alpha), float(bucket_tokens[-1])) / bucket_s


def forecast_rates(
    history: Mapping[str, Sequence[float]], bucket_s: float, alpha: float = DEFAULT_EWMA_ALPHA
) -> dict[str, float]:
    """`forecast_rate` of every key's history (same bucket length for all)."""
    return {key: forecast_rate(tokens, bucket_s, alpha) for key, tokens in history.items()}
