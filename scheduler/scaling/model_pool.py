"""Which base models an embedded server keeps loaded (issue 24 item 5): pure policy, no I/O.

`lorahost serve` runs one in-process worker per base model it serves. The configured model is pinned (started
with the server, never stopped); a catalog model's worker starts when requests wait for it and stops once it
has been idle (nothing running, nothing waiting) for `idle_timeout_s`. Models with more waiting requests start
first.

The budget (issue 33 item 4): the whole memory of the running workers (weights, KV and adapter pools, host
adapter tier, activations: scheduler/scaling/worker_footprint.py), the pinned model's included, stays within
`budget_bytes` (None: no bound). A model asks for `num_bytes` (its configured pools) and starts with no less than
`min_bytes` (its smallest pools). To start one that does not get its full size in what is left, idle models are
stopped, least recently used (longest idle) first, until it does or none is left; it then starts with what is
left (`PoolPlan.granted`: its pools are sized to that), at least `min_bytes`. When even that is out of reach
nothing is stopped for it and it is `blocked`: `is_final` when its smallest size exceeds what the pinned model
leaves of the budget (it can never start: its requests are refused at once), else busy models hold the memory
and its requests wait (refused at the cold-start timeout, saying why).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PooledModel:
    """What the pool knows of one base model now."""

    name: str
    num_bytes: (
        int  # the memory its worker holds (running) or asks for at its configured pool sizes (not running)
    )
    is_running: bool  # its worker is started (loading or ready)
    num_waiting: int = 0  # requests held at the front door for it
    num_active: int = 0  # requests its worker is running or queueing
    idle_since_s: float | None = None  # since when its running worker has had nothing to do (None: busy)
    is_pinned: bool = False  # the configured model: always loaded
    min_bytes: int | None = None  # the least it can start with (smallest pools); None: num_bytes

    @property
    def smallest_bytes(self) -> int:
        """The least memory its worker can start with."""
        return self.num_bytes if self.min_bytes is None else min(self.min_bytes, self.num_bytes)

    @property
    def is_idle(self) -> bool:
        """True when its worker runs and has nothing to do."""
        return self.is_running and self.num_active == 0 and self.num_waiting == 0


@dataclass(frozen=True)
class BlockedModel:
    """A model requests wait for that cannot start now (module doc)."""

    name: str
    min_bytes: int  # the least it could start with
    room_bytes: int  # what the budget would leave it with every idle model stopped
    budget_bytes: int
    is_final: bool  # it exceeds what the pinned model leaves of the budget: it can never start


@dataclass(frozen=True)
class PoolPlan:
    """Models whose workers to start (with the bytes granted to each) and to stop now; models that cannot start."""

    to_start: tuple[str, ...] = ()
    to_stop: tuple[str, ...] = ()
    grants: tuple[tuple[str, int], ...] = ()  # (model, bytes its pools are sized to), one per started model
    blocked: tuple[BlockedModel, ...] = ()

    def granted(self, name: str) -> int | None:
        """The bytes granted to started model `name` (None: not started)."""
        return dict(self.grants).get(name)


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
    pinned = sum(m.num_bytes for m in running if m.is_pinned)
    grants: list[tuple[str, int]] = []
    blocked: list[BlockedModel] = []
    wanted = sorted(
        (m for m in models if not m.is_running and m.num_waiting > 0), key=lambda m: (-m.num_waiting, m.name)
    )
    for model in wanted:
        if budget_bytes is None:
            grants.append((model.name, model.num_bytes))
            continue
        victims = _victims(model, [m for m in stoppable if m.name not in to_stop], budget_bytes - used)
        room = budget_bytes - used + sum(v.num_bytes for v in victims)
        if room < model.smallest_bytes:
            blocked.append(
                BlockedModel(
                    model.name,
                    model.smallest_bytes,
                    room,
                    budget_bytes,
                    model.smallest_bytes > budget_bytes - pinned,
                )
            )
            continue  # nothing stops for it: it waits, or is refused when it can never fit
        to_stop.extend(v.name for v in victims)
        grant = min(model.num_bytes, room)
        grants.append((model.name, grant))
        used = used - sum(v.num_bytes for v in victims) + grant
    return PoolPlan(tuple(n for n, _ in grants), tuple(sorted(to_stop)), tuple(grants), tuple(blocked))


def _victims(model: PooledModel, idle: list[PooledModel], room: int) -> list[PooledModel]:
    """The idle models to stop for `model`, longest idle first, until it gets its full size (all of them when it
    does not get it even then)."""
    victims: list[PooledModel] = []
    for victim in idle:
        if room >= model.num_bytes:
            break
        victims.append(victim)
        room += victim.num_bytes
    return victims
