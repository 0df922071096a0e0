"""The front door of the cluster twin: requests held while no worker can take them (api/cold_start.py).

A held request re-routes every poll interval once a worker is ready, its polls falling on multiples of the
interval after its wait began, and is refused at its deadline (`cold_start_timeout_s` after its first wait).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from twin.trace import TraceRequest


@dataclass
class HeldRequest:
    """A request waiting at the front door since `since_s` (its first wait)."""

    request: TraceRequest
    since_s: float


def next_poll_s(
    held: HeldRequest, moment: float, poll_interval_s: float, strictly_after: bool = False
) -> float:
    """The held request's first poll at or after `moment` (strictly after with `strictly_after`), never at its
    first wait itself."""
    num_polls = math.ceil((moment - held.since_s) / poll_interval_s - 1e-9)
    if strictly_after and held.since_s + num_polls * poll_interval_s <= moment:
        num_polls += 1
    return held.since_s + max(1, num_polls) * poll_interval_s
