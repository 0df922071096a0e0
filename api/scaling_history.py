"""The recent autoscaling decisions of this API server, sampled on the routing-table refresh timer: what the
console charts as desired vs live workers over time per base model.

Kept in memory, bounded (the oldest samples go first), per API replica: every replica computes the same
decisions from the same shared inputs, so any one's history shows the cluster's.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from scheduler.scaling.scaling import ScalingDecision

MAX_SAMPLES = 4096  # decisions kept (one per base model per refresh: ~1.1 h at 1 s and one model)


@dataclass(frozen=True)
class ScalingSample:
    """One base model's decision at one moment."""

    at_s: float  # epoch seconds
    base_model: str
    desired_workers: int
    live_workers: int


class ScalingHistory:
    """A bounded, thread-safe log of scaling decisions, oldest first."""

    def __init__(self, max_samples: int = MAX_SAMPLES) -> None:
        self._samples: deque[ScalingSample] = deque(maxlen=max_samples)
        self._lock = threading.Lock()

    def record(self, decisions: Iterable[ScalingDecision], at_s: float) -> None:
        """Append one sample per decision."""
        new = [ScalingSample(at_s, d.base_model, d.desired_workers, d.live_workers) for d in decisions]
        with self._lock:
            self._samples.extend(new)

    def samples(self) -> list[ScalingSample]:
        """Every sample kept, oldest first."""
        with self._lock:
            return list(self._samples)
