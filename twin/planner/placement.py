"""Placing adapters on GPUs.

`place_ffd` (the paper's greedy, improved): adapters sorted by device size (largest first), zig-zag by rate
within a size; one GPU is filled at a time, asking `judge` at the testing points of its adapter count (and
at the end); when `judge` refuses, the adapters added since the last accepted test are rolled back and
retried one at a time, and the GPU closes at the last accepted set. An adapter that no GPU can take alone
(its rate alone starves one) is split into equal shares placed on different GPUs (routing splits its rate).
`spread_latency`: the latency variant: the same number of GPUs, adapters by rate (highest first) each onto
the GPU with the lowest total rate. `place_max_base` and `place_random`: the paper's baselines.

`judge(adapters)` returns the GPU's accepted `GpuChoice` (adapter cache size and prediction) or None.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Generic, TypeVar

from twin.planner.workload import PlannedAdapter

TEST_POINTS = (1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 192, 256, 320, 384)
MAX_SHARES = 64

Choice = TypeVar("Choice")


@dataclass(frozen=True)
class Placed(Generic[Choice]):
    """One GPU: its adapters and the judge's choice for them."""

    adapters: tuple[PlannedAdapter, ...]
    choice: Choice


class PlacementError(ValueError):
    """No placement exists (an adapter that fits no GPU even alone and with its rate split)."""


def ffd_order(
    adapters: Sequence[PlannedAdapter], size_of: Callable[[PlannedAdapter], int]
) -> list[PlannedAdapter]:
    """Largest device size first; within one size, rates zig-zag (highest, lowest, next highest, ...)."""
    ordered: list[PlannedAdapter] = []
    by_size = sorted(adapters, key=lambda a: (-size_of(a), -a.rate, a.adapter_id))
    for _, group in groupby(by_size, key=size_of):
        same = list(group)  # rate descending
        low, high = 0, len(same) - 1
        while low <= high:
            ordered.append(same[low])
            if low != high:
                ordered.append(same[high])
            low, high = low + 1, high - 1
    return ordered


def place_ffd(
    adapters: Sequence[PlannedAdapter],
    judge: Callable[[Sequence[PlannedAdapter]], Choice | None],
    size_of: Callable[[PlannedAdapter], int],
) -> list[Placed[Choice]]:
    """First-fit decreasing with rollback (module doc)."""
    remaining = _split_unplaceable(ffd_order(adapters, size_of), judge)
    gpus: list[Placed[Choice]] = []
    while remaining:
        current: list[PlannedAdapter] = []
        accepted: tuple[list[PlannedAdapter], Choice] | None = None
        skipped: list[PlannedAdapter] = []
        queue = list(remaining)
        while queue:
            adapter = queue.pop(0)
            if any(a.adapter_id == adapter.adapter_id for a in current):
                skipped.append(adapter)  # another share of it is here already
                continue
            current.append(adapter)
            if len(current) not in TEST_POINTS and queue:
                continue
            choice = judge(current)
            if choice is not None:
                accepted = (list(current), choice)
                continue
            kept = accepted[0] if accepted is not None else []
            retry = current[len(kept) :]
            current = list(kept)
            for candidate in retry:
                choice = judge([*current, candidate])
                if choice is None:
                    break
                current.append(candidate)
                accepted = (list(current), choice)
            break
        if accepted is None:
            raise PlacementError(f"adapter {remaining[0].adapter_id!r} fits no GPU even alone")
        placed_ids = {id(a) for a in accepted[0]}
        gpus.append(Placed(tuple(accepted[0]), accepted[1]))
        remaining = [a for a in remaining if id(a) not in placed_ids]
    return gpus


def spread_latency(
    adapters: Sequence[PlannedAdapter],
    num_gpus: int,
    judge: Callable[[Sequence[PlannedAdapter]], Choice | None],
) -> list[Placed[Choice]] | None:
    """The latency variant over `num_gpus` GPUs (module doc); None when `judge` refuses a GPU."""
    bins: list[list[PlannedAdapter]] = [[] for _ in range(num_gpus)]
    for adapter in sorted(adapters, key=lambda a: (-a.rate, a.adapter_id)):
        free = [b for b in bins if all(a.adapter_id != adapter.adapter_id for a in b)]
        if not free:
            return None
        min(free, key=lambda b: (sum(a.rate for a in b), len(b))).append(adapter)
    placed = []
    for members in bins:
        if not members:
            continue
        choice = judge(members)
        if choice is None:
            return None
        placed.append(Placed(tuple(members), choice))
    return placed


def place_max_base(
    adapters: Sequence[PlannedAdapter],
    fits: Callable[[Sequence[PlannedAdapter]], bool],
    size_of: Callable[[PlannedAdapter], int],
) -> list[tuple[PlannedAdapter, ...]]:
    """MaxBase: pack each GPU with as many adapters as its memory holds (`fits`), load ignored."""
    gpus: list[tuple[PlannedAdapter, ...]] = []
    current: list[PlannedAdapter] = []
    for adapter in ffd_order(adapters, size_of):
        if current and not fits([*current, adapter]):
            gpus.append(tuple(current))
            current = []
        current.append(adapter)
    if current:
        gpus.append(tuple(current))
    return gpus


def place_random(
    adapters: Sequence[PlannedAdapter], num_gpus: int, *, seed: int = 0
) -> list[tuple[PlannedAdapter, ...]]:
    """Random: each adapter on a uniformly random one of `num_gpus` GPUs (empty GPUs dropped)."""
    rng = random.Random(seed)
    bins: list[list[PlannedAdapter]] = [[] for _ in range(num_gpus)]
    for adapter in adapters:
        bins[rng.randrange(num_gpus)].append(adapter)
    return [tuple(b) for b in bins if b]


def _split_unplaceable(
    adapters: list[PlannedAdapter], judge: Callable[[Sequence[PlannedAdapter]], Choice | None]
) -> list[PlannedAdapter]:
    out = []
    for adapter in adapters:
        num_shares = 1
        while judge([adapter.share(num_shares)]) is None:
            num_shares *= 2
            if num_shares > MAX_SHARES:
                raise PlacementError(
                    f"adapter {adapter.adapter_id!r} fits no GPU even alone with its rate split {MAX_SHARES} ways"
                )
        out += [adapter.share(num_shares) for _ in range(num_shares)]
    return out
