"""Autoscaling decision: how many workers one base model needs. Pure: hand-made state in, a decision out.

Capacity model (the one placement uses, scheduler/placement/placement.py): a worker sustains OP[r] tokens/s at rank
bucket r within the SLO, so demand D_r (tokens/s per bucket) needs sum_r D_r / OP[r] workers at full load;
    demand_workers = ceil(sum_r D_r / OP[r] / target_utilisation)
Rules, in order:
1. Requests waiting with no live worker (a cold start): at least one worker (scale from zero).
2. Idle: no request for `scale_to_zero_idle_s` and nothing waiting -> 0 (min_workers when it is above 0).
   Before that, a model that served recently keeps at least one worker even at a forecast of 0.
3. Demand: demand_workers of the *peak* demand over the scale-down cooldown window, so a dip shorter than
   `scale_down_cooldown_s` never scales down (hysteresis) while a rise scales up at once (the peak includes
   now).
4. Queue growth: more than `max_waiting_per_worker` requests waiting per live worker -> enough workers for
   that many each (always more than the live ones).
5. Clamped to [min_workers, max_workers].
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduler.placement.placement import rank_bucket

DEFAULT_TARGET_UTILISATION = 0.8
DEFAULT_SCALE_TO_ZERO_IDLE_S = 600.0
DEFAULT_SCALE_DOWN_COOLDOWN_S = 300.0
DEFAULT_MAX_WAITING_PER_WORKER = 8


@dataclass(frozen=True)
class ScalingPolicy:
    """Operator limits and thresholds (settings/capacity.py ScalingSettings: scaling_*)."""

    operating_points: Mapping[int, float]
    target_utilisation: float = DEFAULT_TARGET_UTILISATION
    min_workers: int = 0
    max_workers: int = 8
    scale_to_zero_idle_s: float = DEFAULT_SCALE_TO_ZERO_IDLE_S
    scale_down_cooldown_s: float = DEFAULT_SCALE_DOWN_COOLDOWN_S
    max_waiting_per_worker: int = DEFAULT_MAX_WAITING_PER_WORKER

    def __post_init__(self) -> None:
        if not 0 < self.target_utilisation <= 1:
            raise ValueError(f"target_utilisation must be in (0, 1], not {self.target_utilisation}")
        if not 0 <= self.min_workers <= self.max_workers:
            raise ValueError(
                f"need 0 <= min_workers ({self.min_workers}) <= max_workers ({self.max_workers})"
            )
        if self.max_waiting_per_worker < 1:
            raise ValueError(f"max_waiting_per_worker must be >= 1, not {self.max_waiting_per_worker}")

    def workers_for(self, demand_by_rank: Mapping[int, float]) -> int:
        """Workers the capacity model needs for tokens/s per adapter rank, at the target utilisation."""
        buckets = list(self.operating_points)
        units = sum(
            d / self.operating_points[rank_bucket(r, buckets)] for r, d in demand_by_rank.items() if d > 0
        )
        return math.ceil(units / self.target_utilisation - 1e-9) if units > 0 else 0


@dataclass(frozen=True)
class BaseModelLoad:
    """What is known about one base model now.

    demand_by_rank: forecast tokens/s per adapter rank (rank 0 = the base model itself).
    peak_demand_by_rank: per rank, the highest bucket rate over the scale-down cooldown window (it should
    include the forecast; the decision takes the max of both anyway).
    idle_s: seconds since its last request started (None: no request on record).
    num_waiting: requests waiting now: in API cold-start waits plus the live workers' queues.
    """

    base_model: str
    num_live_workers: int
    demand_by_rank: Mapping[int, float] = field(default_factory=dict)
    peak_demand_by_rank: Mapping[int, float] = field(default_factory=dict)
    idle_s: float | None = None
    num_waiting: int = 0

    @property
    def demand_tokens_per_s(self) -> float:
        """Total forecast tokens/s."""
        return float(sum(self.demand_by_rank.values()))


@dataclass(frozen=True)
class ScalingDecision:
    """The number of workers a base model should run and why (reason is for operators, not parsed)."""

    base_model: str
    desired_workers: int
    live_workers: int
    demand_tokens_per_s: float
    reason: str


def decide_scaling(load: BaseModelLoad, policy: ScalingPolicy) -> ScalingDecision:
    """The desired worker count of `load.base_model` (rules in the module docstring)."""
    desired, reason = _unclamped(load, policy)
    clamped = min(policy.max_workers, max(policy.min_workers, desired))
    if clamped != desired:
        reason += f"; clamped to [{policy.min_workers}, {policy.max_workers}]"
    return ScalingDecision(load.base_model, clamped, load.num_live_workers, load.demand_tokens_per_s, reason)


def _unclamped(load: BaseModelLoad, policy: ScalingPolicy) -> tuple[int, str]:
    if load.num_waiting > 0 and load.num_live_workers == 0:
        return max(
            1, _demand_workers(load, policy)
        ), f"scale from zero: {load.num_waiting} request(s) waiting"
    is_idle = load.idle_s is None or load.idle_s >= policy.scale_to_zero_idle_s
    if is_idle and load.num_waiting == 0:
        since = "no request on record" if load.idle_s is None else f"no request for {load.idle_s:.0f} s"
        return 0, f"idle: {since} (scale_to_zero_idle_s={policy.scale_to_zero_idle_s:g})"
    desired = max(1, _demand_workers(load, policy))
    reason = f"demand {load.demand_tokens_per_s:.1f} tokens/s (peak over cooldown) needs {desired}"
    per_worker = load.num_waiting / max(1, load.num_live_workers)
    if per_worker > policy.max_waiting_per_worker:
        by_queue = max(load.num_live_workers + 1, math.ceil(load.num_waiting / policy.max_waiting_per_worker))
        if by_queue > desired:
            desired = by_queue
            reason = f"queue growth: {load.num_waiting} waiting on {load.num_live_workers} worker(s) needs {desired}"
    return desired, reason


def _demand_workers(load: BaseModelLoad, policy: ScalingPolicy) -> int:
    ranks = set(load.demand_by_rank) | set(load.peak_demand_by_rank)
    peak = {r: max(load.demand_by_rank.get(r, 0.0), load.peak_demand_by_rank.get(r, 0.0)) for r in ranks}
    return policy.workers_for(peak)
