"""The cluster twin's event queue: events in time order, ties broken by kind, then by insertion."""

from __future__ import annotations

import heapq
import itertools
from enum import IntEnum
from typing import Generic, TypeVar

P = TypeVar("P")


class EventKind(IntEnum):
    """Event kinds of the cluster twin; the value orders events of the same time."""

    READY = 0
    PLACEMENT = 1
    SCALING = 2
    FETCHED = 3
    POLL = 4
    ARRIVAL = 5
    TIMEOUT = 6


class EventQueue(Generic[P]):
    """A min-heap of (time, kind, payload); equal times pop in `EventKind` order, then first pushed first."""

    def __init__(self) -> None:
        self._events: list[tuple[float, int, int, EventKind, P]] = []
        self._order = itertools.count()

    def __bool__(self) -> bool:
        return bool(self._events)

    def push(self, moment: float, kind: EventKind, payload: P) -> None:
        """Queue an event at `moment`."""
        heapq.heappush(self._events, (moment, int(kind), next(self._order), kind, payload))

    def pop(self) -> tuple[float, EventKind, P]:
        """The earliest event: (time, kind, payload)."""
        moment, _, _, kind, payload = heapq.heappop(self._events)
        return moment, kind, payload
