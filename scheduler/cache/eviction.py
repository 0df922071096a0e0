"""Adapter cache eviction policies: which idle device adapter goes first (plain data in, order out; no torch).

The adapter cache is the device adapters no running request uses; it lives in pages that KV blocks do not
need right now and shrinks when a step needs pages (scheduler/core/adapter_residency.py asks a policy for
the order). A policy sees one `EvictionCandidate` per evictable adapter and a `CacheView` of the whole
cache and returns the candidates' ids, first to evict first. Candidates arrive least recently used first
and every policy breaks ties in that order. The residency applies a policy to each eligibility class on its
own (idle adapters, then adapters only waiting requests use); running requests' adapters are never
candidates.

Policies (`EVICTION_POLICIES`, chosen by `adapter_eviction_policy`):
- `lru`: the arrival order (least recently used first), the baseline.
- `chameleon`: Chameleon's score `F*frequency + R*recency + S*size` (0.45/0.10/0.45), lowest first.
- `fastlibra`: FastLibra's Eval `LoRA_Eval * cost * prob * (1 - sigmoid(age / tau))`, lowest first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

DEFAULT_LINK_BYTES_PER_S = 16e9
"""Host-to-device bandwidth for reload-cost estimates when no load was measured: PCIe 4.0 x16 moves
~25 GB/s peak and ~16 GB/s in practice from pinned host memory (the engine replaces the estimate with the
measured load seconds once an adapter has been loaded)."""

ACCESS_WINDOW_S = 60.0
"""Frequency window: accesses (requests arriving for an adapter) older than this are forgotten."""

BATCH_SIZE_WINDOW_S = 5.0
"""FastLibra's BS is the mean batch size over this many recent seconds."""

FASTLIBRA_TAU_S = 10.0
"""FastLibra's recency time scale (the paper leaves its unit open): an adapter unused for tau seconds keeps
1 - sigmoid(1) = 27% of its value, for 3 tau 5%."""


@dataclass(frozen=True)
class EvictionCandidate:
    """One evictable device adapter, as a policy sees it.

    `num_recent_accesses`: requests for it that arrived within the access window; `last_use`: clock seconds
    of its last use (arrival, admission, load); `load_seconds`: what bringing it back costs (measured, else
    estimated from bytes and link bandwidth); `is_waiting`: a waiting request or lease uses it.
    """

    adapter_id: str
    num_bytes: int
    num_pages: int
    rank: int
    num_recent_accesses: int
    last_use: float
    load_seconds: float
    is_waiting: bool = False


@dataclass(frozen=True)
class CacheView:
    """The cache-wide numbers a policy may need (same clock as `EvictionCandidate.last_use`).

    `access_shares`: every adapter's share of the accesses in the window (prob_i; sums to 1, or empty when
    there were none); `recent_batch_size`: mean sequences per step over the last BATCH_SIZE_WINDOW_S;
    `num_device_adapters`: adapters on the device now (FastLibra's Now_lora).
    """

    now: float
    num_device_adapters: int
    num_recent_accesses: int = 0
    access_shares: tuple[float, ...] = ()
    recent_batch_size: float = 1.0

    def share_of(self, candidate: EvictionCandidate) -> float:
        """The candidate's share of recent accesses (FastLibra's prob(n)); 0 without accesses."""
        if self.num_recent_accesses <= 0:
            return 0.0
        return candidate.num_recent_accesses / self.num_recent_accesses


class EvictionPolicy(Protocol):
    """Orders evictable adapters; `order` must return a permutation of the candidates' ids."""

    name: str

    def order(self, candidates: Sequence[EvictionCandidate], view: CacheView) -> list[str]:
        """Candidate ids, first to evict first (candidates arrive least recently used first)."""
        ...


class LruPolicy:
    """Least recently used first: the arrival order."""

    name = "lru"

    def order(self, candidates: Sequence[EvictionCandidate], view: CacheView) -> list[str]:
        """The candidates as given (the residency keeps them least recently used first)."""
        return [c.adapter_id for c in candidates]


class ChameleonPolicy:
    """Chameleon's cache score `F*frequency + R*recency + S*size`; the lowest score is evicted first.

    Big and popular adapters stay (they are costly to reload). Normalisation, over the candidates of one
    call (the paper does not define it):
    - frequency = accesses in the window / the most accesses of any candidate (0 when none had any);
    - size = bytes / the largest candidate's bytes (ratio to the max, not min-max: an adapter 90% as big as
      the largest scores 0.9, not 0);
    - recency = 1 - age / the oldest candidate's age, age = now - last_use (the least recently used
      candidate scores 0, one used now 1; all 1 when every age is 0).
    Each term is in [0, 1]; ties keep the least recently used first.
    """

    name = "chameleon"

    def __init__(
        self, frequency_weight: float = 0.45, recency_weight: float = 0.10, size_weight: float = 0.45
    ):
        self.frequency_weight = frequency_weight
        self.recency_weight = recency_weight
        self.size_weight = size_weight

    def scores(self, candidates: Sequence[EvictionCandidate], view: CacheView) -> dict[str, float]:
        """Each candidate's score (higher = kept longer)."""
        max_accesses = max((c.num_recent_accesses for c in candidates), default=0)
        max_bytes = max((c.num_bytes for c in candidates), default=0)
        max_age = max((view.now - c.last_use for c in candidates), default=0.0)
        scores = {}
        for c in candidates:
            frequency = c.num_recent_accesses / max_accesses if max_accesses > 0 else 0.0
            size = c.num_bytes / max_bytes if max_bytes > 0 else 0.0
            recency = 1.0 - max(view.now - c.last_use, 0.0) / max_age if max_age > 0 else 1.0
            scores[c.adapter_id] = (
                self.frequency_weight * frequency + self.recency_weight * recency + self.size_weight * size
            )
        return scores

    def order(self, candidates: Sequence[EvictionCandidate], view: CacheView) -> list[str]:
        """Ascending score."""
        scores = self.scores(candidates, view)
        return sorted((c.adapter_id for c in candidates), key=scores.__getitem__)


class FastLibraPolicy:
    """FastLibra's cost model; the lowest Eval is evicted first.

        Eval(n)      = LoRA_Eval * cost(n) * prob(n) * (1 - sigmoid((now - last_use(n)) / tau))
        cost(n)      = load seconds (measured, else size / link bandwidth)
        prob(n)      = n's share of the accesses in the window
        LoRA_Eval    = max(1, Low_lora / Now_lora)
        Low_lora     = sum_i [1 - (1 - prob_i)^BS]   (expected distinct adapters in a batch of BS)

    BS is the recent mean batch size and Now_lora the device adapter count. LoRA_Eval is the same for every
    adapter, so it does not change the order among adapters; it weighs adapters against KV prefix nodes
    (LoRA_Eval 1) once those are candidates too, and it is part of `value` for that. An adapter with no
    access in the window has Eval 0: such ties keep the least recently used first.
    """

    name = "fastlibra"

    def __init__(self, tau_s: float = FASTLIBRA_TAU_S) -> None:
        if tau_s <= 0:
            raise ValueError(f"tau_s must be positive, got {tau_s}")
        self.tau_s = tau_s

    @staticmethod
    def lora_eval(view: CacheView) -> float:
        """max(1, Low_lora / Now_lora): > 1 while fewer adapters are resident than a batch is expected to use."""
        batch_size = max(view.recent_batch_size, 1.0)
        expected_distinct = sum(1.0 - (1.0 - p) ** batch_size for p in view.access_shares)
        return max(1.0, float(expected_distinct) / max(view.num_device_adapters, 1))

    def value(self, candidate: EvictionCandidate, view: CacheView, lora_eval: float | None = None) -> float:
        """Eval(n) of one adapter (seconds of reload time expected to be saved by keeping it)."""
        age = max(view.now - candidate.last_use, 0.0)
        decay = 1.0 / (1.0 + math.exp(min(age / self.tau_s, 700.0)))  # 1 - sigmoid(age / tau)
        if lora_eval is None:
            lora_eval = self.lora_eval(view)
        return lora_eval * candidate.load_seconds * view.share_of(candidate) * decay

    def order(self, candidates: Sequence[EvictionCandidate], view: CacheView) -> list[str]:
        """Ascending Eval."""
        lora_eval = self.lora_eval(view)
        values = {c.adapter_id: self.value(c, view, lora_eval) for c in candidates}
        return sorted((c.adapter_id for c in candidates), key=values.__getitem__)


EVICTION_POLICIES: dict[str, type[EvictionPolicy]] = {
    "lru": LruPolicy,
    "chameleon": ChameleonPolicy,
    "fastlibra": FastLibraPolicy,
}
DEFAULT_EVICTION_POLICY = "lru"


def make_eviction_policy(name: str) -> EvictionPolicy:
    """The eviction policy a setting names (adapter_eviction_policy); ValueError lists the choices."""
    policy_class = EVICTION_POLICIES.get(name)
    if policy_class is None:
        raise ValueError(
            f"unknown adapter eviction policy {name!r}; choose one of {sorted(EVICTION_POLICIES)}"
        )
    return policy_class()


def estimated_load_seconds(num_bytes: int, link_bytes_per_s: float = DEFAULT_LINK_BYTES_PER_S) -> float:
    """Reload cost of an adapter never measured: its bytes over the host-to-device bandwidth."""
    return max(num_bytes, 0) / link_bytes_per_s
