"""`SimClock`: simulated seconds, the one clock a simulated worker's engine core reads (request times, policy
and eviction ages, step durations). Only the simulation moves it forward."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SimClock:
    """A clock the simulation advances; calling it reads the time (the engine core's `clock()`)."""

    now: float = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move forward by `seconds` (>= 0)."""
        if seconds < 0:
            raise ValueError(f"a clock cannot go back ({seconds} s)")
        self.now += seconds

    def advance_to(self, moment: float) -> None:
        """Move forward to `moment` (no change when it is already past)."""
        self.now = max(self.now, moment)
