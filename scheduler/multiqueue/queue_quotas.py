"""Per-queue token quotas of the multi-queue scheduler (Chameleon's K x M/M/1 rule).

A queue holding a quota of Tok tokens, whose requests need S tokens each and hold them for D seconds,
serves mu = Tok / (S * D) requests per second. As an M/M/1 queue with arrival rate lambda its mean time
in system is T = 1 / (mu - lambda); T <= SLO needs
    Tok_min = S * D * (1 / SLO + lambda).
Each queue gets its Tok_min; what is left of the capacity is split in proportion to each queue's token
demand rate lambda * S (its share of arrivals times their size; evenly when no queue has any demand). When
the minima add up to more than the capacity, they are all scaled down by the same factor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class QueueLoad:
    """One queue's measured load over the recent window."""

    mean_need_tokens: float  # S: a request's quota charge
    mean_service_s: float  # D: admission to finish
    arrival_rate: float  # lambda: requests per second

    def __post_init__(self) -> None:
        if min(self.mean_need_tokens, self.mean_service_s, self.arrival_rate) < 0:
            raise ValueError(f"queue load figures must be >= 0, got {self}")

    @property
    def demand_rate(self) -> float:
        """Tokens per second this queue asks for (lambda * S): its weight for the remainder."""
        return self.arrival_rate * self.mean_need_tokens


def min_quota_tokens(load: QueueLoad, slo_s: float) -> float:
    """Tok_min = S * D * (1 / SLO + lambda): the smallest quota meeting the SLO as an M/M/1 queue."""
    if slo_s <= 0:
        raise ValueError(f"slo_s must be positive, got {slo_s}")
    return load.mean_need_tokens * load.mean_service_s * (1.0 / slo_s + load.arrival_rate)


def split_quotas(loads: Sequence[QueueLoad], capacity_tokens: float, slo_s: float) -> list[float]:
    """Quotas (tokens) that add up to `capacity_tokens`: M/M/1 minima, then the rest by demand rate."""
    if not loads:
        raise ValueError("split_quotas needs at least one queue")
    if capacity_tokens < 0:
        raise ValueError(f"capacity_tokens must be >= 0, got {capacity_tokens}")
    minima = [min_quota_tokens(load, slo_s) for load in loads]
    total_min = sum(minima)
    if total_min >= capacity_tokens and total_min > 0:
        scale = capacity_tokens / total_min
        return [m * scale for m in minima]
    remainder = capacity_tokens - total_min
    weights = [load.demand_rate for load in loads]
    total_weight = sum(weights)
    if total_weight <= 0:
        weights, total_weight = [1.0] * len(loads), float(len(loads))
    return [m + remainder * w / total_weight for m, w in zip(minima, weights, strict=True)]
