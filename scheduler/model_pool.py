"""Which base models an embedded server keeps loaded (issue 24 item 5): pure policy, no I/O.

`lorahost serve` runs one in-process worker per base model it serves. The configured model is pinned (started
with the server, never stopped); a catalog model's worker starts when requests wait for it and stops once it
has been idle (nothing running, nothing waiting) for `idle_timeout_s`. The loaded models' weights stay within
`budget_bytes` (None: no bound): to start a model that does not fit, idle models are stopped longest-idle
first; a model still without room waits (its requests stay held at the front door, refused only at the
cold-start timeout). Models with more waiting requests start first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PooledModel:
    """What the pool knows of one base model now."""

    name: str
    num_bytes: int  # the memory its worker holds, estimated by its weights' size
    is_running: bool  # its worker is started (loading or ready)
    num_waiting: int = 0  # requests held at the front door for it
    num_active: int = 0  # requests its worker is running or queueing
    idle_since_s: float | None = None  # since when its running worker has had nothing to do (None: busy)
    is_pinned: bool = False  # the configured model: always loaded

    @property
    def is_idle(self) -> bool:
        """True when its worker runs and has nothing to do."""
        return self.is_running and self.num_active == 0 and self.num_waiting == 0


@dataclass(frozen=True)
class PoolPlan:
    """Models whose workers to start and to stop now."""

    to_start: tuple[str, ...] = ()
    to_stop: tuple[str, ...] = ()


def plan_model_pool(
    models: Sequence[PooledModel], *, budget_bytes: int | None, idle_timeout_s: float, now_s: float
) -> PoolPlan:
    """The starts and stops that serve waiting requests within the memory budget (module doc)."""
    running = [m for m in models if m.is_running]
    stoppable = sorted(
        (m for m in running if m.is_idle and not m.is_pinned),
        key=lambda m: (m.idle_since_s if m.idle_since_s is not None else now_s, m.name),
    )
    to_stop = [
        m.name for m in stoppable if m.idle_since_s is not None and now_s - m.idle_since_s >= idle_timeout_s
    ]
    used = sum(m.num_bytes for m in running if m.name not in to_stop)
    to_start: list[str] = []
    wanted = sorted(
        (m for m in models if not m.is_running and m.num_waiting > 0), key=lambda m: (-m.num_waiting, m.name)
    )
    for model in wanted:
        if budget_bytes is not None and used + model.num_bytes > budget_bytes:
            victims = [m for m in stoppable if m.name not in to_stop]
            if used - sum(v.num_bytes for v in victims) + model.num_bytes > budget_bytes:
                continue  # no room even with every idle model stopped: it waits
            for victim in victims:  # make room: idle models, longest idle first
                if used + model.num_bytes <= budget_bytes:
                    break
                to_stop.append(victim.name)
                used -= victim.num_bytes
        to_start.append(model.name)
        used += model.num_bytes
    return PoolPlan(tuple(to_start), tuple(sorted(to_stop)))
