"""The multi-queue policy's sliding window of recent requests, and what it measures: each class's load (S, D,
lambda) and the seconds of service per predicted output token. Plain numbers in, numbers out."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from scheduler.multiqueue.queue_quotas import QueueLoad
from scheduler.multiqueue.request_size import RequestShape


@dataclass
class WindowSample:
    """One request of the window."""

    arrival_time: float
    shape: RequestShape
    adapter_id: str | None
    adapter_tokens: int  # its adapter's device memory in KV tokens
    charged_adapter_tokens: (
        int  # the part of it its quota charge counts (scheduler/multiqueue/queue_sizing.py)
    )
    duration_s: float | None = None  # admission to finish, once finished

    @property
    def need_tokens(self) -> int:
        """Its quota charge: prompt + predicted output + the adapter tokens charged to it."""
        return self.shape.num_prompt_tokens + self.shape.num_output_tokens + self.charged_adapter_tokens


def window_load(now: float, members: Sequence[WindowSample], window: Sequence[WindowSample]) -> QueueLoad:
    """S, D and lambda of one class (`members`) over `window` (not empty) at `now`; D falls back to the whole
    window's mean duration (then 0)."""
    span = max(now - min(s.arrival_time for s in window), 1e-9)
    durations = [s.duration_s for s in members if s.duration_s is not None]
    if not durations:
        durations = [s.duration_s for s in window if s.duration_s is not None]
    return QueueLoad(
        mean_need_tokens=sum(s.need_tokens for s in members) / len(members) if members else 0.0,
        mean_service_s=sum(durations) / len(durations) if durations else 0.0,
        arrival_rate=len(members) / span,
    )


def seconds_per_output_token(window: Iterable[WindowSample], default: float) -> float:
    """Measured service seconds per predicted output token over the window's finished requests (`default`
    before any finished)."""
    finished = [s for s in window if s.duration_s is not None]
    num_tokens = sum(max(1, s.shape.num_output_tokens) for s in finished)
    return sum(s.duration_s or 0.0 for s in finished) / num_tokens if finished else default
