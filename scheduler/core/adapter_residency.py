"""Adapter residency: which adapters are on the host, being copied, or on the device, and who pins them.

The core (not the worker, not the model runner) decides what is resident. Every adapter the engine knows
has a host copy (`host_path`, fetched and verified by the worker) and a state:

    NONE -> HOST (registered) -> PREPARING (pages reserved, load planned: its host copy is being read,
    validated and packed off the step loop) -> COPYING (host copy ready, copy to the device under way)
    -> DEVICE -> HOST (evicted)

The load is planned as one move (`plan_load`: pages reserved, PREPARING); the engine reports the host copy
ready (`mark_prepared`: COPYING, so CPU-assisted prefill may start on it) and then the copy landed
(`mark_loaded`: DEVICE), or a failure of either (`cancel_load`: back to HOST).

Pins: `num_running` counts running sequences (never evicted), `num_waiting` counts waiting sequences and
external leases (a worker request between admission and entering the engine, a prefetch): evicted only when
memory forces it. Idle adapters (no pin) are the adapter cache: they stay on the device while pages are
free and go first when pages are needed, in the order of an `EvictionPolicy` (scheduler/cache/eviction.py: lru,
chameleon, fastlibra); the waiting-only class comes after them, in the same policy's order.
With `is_caching_idle_adapters` False there is no adapter cache (the S-LoRA / no-cache baseline):
`drop_idle_adapters` evicts every device adapter as soon as nothing pins it (the batch scheduler calls it
at the start of each step).
Device bytes come from the one page pool (`PagePool.reserve_moving`), which alone decides how many adapters
fit (no count cap); in a unified pool a load may move up to `max_compaction_pages` KV pages out of its run
(`on_kv_moves` tells the block tables and the step plan).

Access statistics for the policies, on an injected clock (wall time `time.time` by default; the engine
passes its one clock, shared with the batch scheduler; tests and the digital twin drive their own): an
access is a request for the adapter arriving (`record_access`); the last use is the latest access, pin or
load; load seconds are measured by the engine (`mark_loaded`) or estimated from bytes over the link
bandwidth. Only differences of readings matter, so a wall clock serves like a monotonic one unless the
system clock jumps (then ages and windows are off until the jumped readings leave the windows).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping

from scheduler.cache.eviction import (
    ACCESS_WINDOW_S,
    DEFAULT_LINK_BYTES_PER_S,
    CacheView,
    EvictionCandidate,
    EvictionPolicy,
    LruPolicy,
    estimated_load_seconds,
)
from scheduler.core.adapter_access import AdapterAccessStats
from scheduler.core.adapter_state import RESERVED_RESIDENCIES, AdapterState, Residency
from scheduler.core.page_pool import PagePool, num_pages_for_adapter

__all__ = ["RESERVED_RESIDENCIES", "AdapterResidency", "AdapterState", "Residency"]


class AdapterResidency:
    """Registry of adapters with their residency, pages and pins; plans loads and evictions."""

    def __init__(
        self,
        pool: PagePool,
        page_bytes: int,
        *,
        policy: EvictionPolicy | None = None,
        clock: Callable[[], float] = time.time,
        link_bytes_per_s: float = DEFAULT_LINK_BYTES_PER_S,
        access_window_s: float = ACCESS_WINDOW_S,
        is_caching_idle_adapters: bool = True,
        max_compaction_pages: int = 0,
    ) -> None:
        if page_bytes <= 0:
            raise ValueError("page_bytes must be positive")
        if link_bytes_per_s <= 0 or access_window_s <= 0:
            raise ValueError("link_bytes_per_s and access_window_s must be positive")
        self.pool = pool
        self.page_bytes = page_bytes
        self.policy: EvictionPolicy = policy if policy is not None else LruPolicy()
        self.clock = clock
        self.link_bytes_per_s = link_bytes_per_s
        self.is_caching_idle_adapters = is_caching_idle_adapters
        self._states: dict[str, AdapterState] = {}
        # Device-side adapters (PREPARING, COPYING or DEVICE), least recently used first.
        self._on_device: OrderedDict[str, None] = OrderedDict()
        self.access_window_s = access_window_s
        self.access = AdapterAccessStats(access_window_s)
        # KV pages one load may move out of its run (unified pool, PagePool.reserve_moving; 0: none)
        self.max_compaction_pages = max_compaction_pages
        self.num_loads = 0
        self.num_evictions = 0
        self.version = 0  # bumped whenever an adapter is registered, forgotten, or joins or leaves the device
        self._ranks: tuple[int, dict[str, int]] = (-1, {})  # adapter_ranks() at a version
        self.num_timed_loads = 0
        self.load_seconds_total = 0.0
        # Called with an adapter id whenever it leaves the device (evict, forget, failed copy), before its
        # pages go back: the prefix cache drops the adapter's KV blocks there (no KV outlives its adapter).
        self.on_leave_device: list[Callable[[str], object]] = []  # return values are ignored
        # Called with the KV page moves (old, new) of a load that moved KV pages out of its run, right after
        # the pool made them: the block tables and the prefix cache follow, the step plan carries the copies.
        self.on_kv_moves: list[Callable[[list[tuple[int, int]]], object]] = []

    # ---- registry -----------------------------------------------------------------------------------

    def register(
        self, adapter_id: str, host_path: str | None, rank: int, num_bytes: int, num_pages: int | None = None
    ) -> AdapterState:
        """Record (or update) an adapter's host copy; a device-resident adapter keeps its residency.
        `num_pages`: the exact device pages the engine's layout needs (default: cut by rank rows)."""
        self.version += 1
        state = self._states.get(adapter_id)
        if state is None:
            state = AdapterState(adapter_id, host_path, rank, num_bytes, num_pages, last_use=self.clock())
            self._states[adapter_id] = state
        elif state.residency is Residency.NONE or state.residency is Residency.HOST:
            if (rank, num_bytes) != (state.rank, state.num_bytes):
                state.load_seconds = None  # new weights: the measured load time no longer applies
            state.host_path, state.rank, state.num_bytes, state.num_pages = (
                host_path,
                rank,
                num_bytes,
                num_pages,
            )
            state.residency = Residency.HOST
        return state

    def get(self, adapter_id: str) -> AdapterState | None:
        """The adapter's state, or None when the engine never saw it."""
        return self._states.get(adapter_id)

    def residency(self, adapter_id: str) -> Residency:
        """NONE for unknown adapters."""
        state = self._states.get(adapter_id)
        return Residency.NONE if state is None else state.residency

    def is_reserved(self, adapter_id: str | None) -> bool:
        """True when the adapter needs no new load: on the device, or its load already planned."""
        return adapter_id is not None and self.residency(adapter_id) in RESERVED_RESIDENCIES

    def device_adapters(self) -> list[str]:
        """Adapters on the device or being loaded there (preparing or copying), least recently used first."""
        return list(self._on_device)

    def adapter_ranks(self) -> Mapping[str, int]:
        """Rank of every adapter with a copy (device, copying or host); built once per `version` (read-only)."""
        if self._ranks[0] != self.version:
            ranks = {a: s.rank for a, s in self._states.items() if s.residency is not Residency.NONE}
            self._ranks = (self.version, ranks)
        return self._ranks[1]

    def num_device_bytes(self) -> int:
        """Bytes of the adapters on the device (or being loaded there)."""
        return sum(self._states[a].num_bytes for a in self._on_device)

    def num_host_adapters(self) -> int:
        """Registered adapters whose only copy is on the host."""
        return sum(1 for s in self._states.values() if s.residency is Residency.HOST)

    def touch(self, adapter_id: str) -> None:
        """Mark as most recently used."""
        state = self._states.get(adapter_id)
        if state is not None:
            state.last_use = self.clock()
        if adapter_id in self._on_device:
            self._on_device.move_to_end(adapter_id)

    # ---- access statistics --------------------------------------------------------------------------

    def record_access(self, adapter_id: str) -> None:
        """A request for the adapter arrived: counts toward its frequency and marks it used."""
        self.access.record_access(adapter_id, self.clock())
        self.touch(adapter_id)

    def num_recent_accesses(self, adapter_id: str) -> int:
        """Accesses to the adapter within the access window."""
        return self.access.num_recent_accesses(adapter_id, self.clock())

    def record_batch_size(self, num_seqs: int, now: float | None = None) -> None:
        """One step planned at `now` (default: the clock) ran `num_seqs` sequences (FastLibra's recent batch
        size)."""
        self.record_batch_sizes(num_seqs, [self.clock() if now is None else now])

    def record_batch_sizes(self, num_seqs: int, step_starts: list[float]) -> None:
        """Steps planned at `step_starts` (ascending) each ran `num_seqs` sequences (what one
        `record_batch_size` per step leaves; scheduler/core/adapter_access.py)."""
        self.access.record_batch_sizes(num_seqs, step_starts)

    def cache_view(self) -> CacheView:
        """What the eviction policy sees of the whole cache now."""
        return self.access.cache_view(self.clock(), len(self._on_device))

    def load_seconds_of(self, state: AdapterState) -> float:
        """The adapter's reload cost: measured when it was loaded before, else bytes / link bandwidth."""
        if state.load_seconds is not None:
            return state.load_seconds
        return estimated_load_seconds(state.num_bytes, self.link_bytes_per_s)

    def candidate(self, state: AdapterState) -> EvictionCandidate:
        """The policy's view of one adapter."""
        return EvictionCandidate(
            adapter_id=state.adapter_id,
            num_bytes=state.num_bytes,
            num_pages=len(state.page_ids) or self.num_pages_for(state),
            rank=state.rank,
            num_recent_accesses=self.access.num_accesses[state.adapter_id],
            last_use=state.last_use,
            load_seconds=self.load_seconds_of(state),
            is_waiting=state.num_waiting > 0,
        )

    # ---- pins ---------------------------------------------------------------------------------------

    def pin(self, adapter_id: str, is_running: bool = False) -> None:
        """Add a pin (a running sequence, or a waiting sequence / lease); the adapter must be registered."""
        state = self._states[adapter_id]
        if is_running:
            state.num_running += 1
        else:
            state.num_waiting += 1
        self.touch(adapter_id)

    def unpin(self, adapter_id: str, is_running: bool = False) -> None:
        """Remove a pin added with the same `is_running`."""
        state = self._states.get(adapter_id)
        if state is None:
            return
        if is_running:
            state.num_running = max(0, state.num_running - 1)
        else:
            state.num_waiting = max(0, state.num_waiting - 1)

    # ---- planning -----------------------------------------------------------------------------------

    def num_pages_for(self, state: AdapterState) -> int:
        """Pages the adapter takes on the device."""
        if state.num_pages is not None:
            return state.num_pages
        return num_pages_for_adapter(state.rank, state.num_bytes, self.page_bytes)

    def plan_load(
        self, adapter_id: str, may_evict_waiting: bool, min_free_kv_blocks: int = 0
    ) -> list[str] | None:
        """Reserve room for a host adapter and mark it PREPARING; returns the adapters evicted to make room.

        Idle adapters go first (in the policy's order), then, when `may_evict_waiting`, adapters only
        waiting requests use. `min_free_kv_blocks`: KV pages that must stay free afterwards (a prefetch
        leaves room for the running sequences). None (and nothing changed) when it cannot fit; an adapter
        already on the device (or being loaded there) returns [].
        """
        state = self._states[adapter_id]
        if state.residency in RESERVED_RESIDENCIES:
            self.touch(adapter_id)
            return []
        num_pages = self.num_pages_for(state)
        victims = self._victims_for(num_pages, may_evict_waiting, min_free_kv_blocks)
        if victims is None:
            return None
        for victim in victims:
            self.evict(victim)
        reservation = self.pool.reserve_moving(num_pages, self.max_compaction_pages)
        assert reservation is not None, "victims were chosen so that the pages fit"
        page_ids, moves = reservation
        for callback in self.on_kv_moves if moves else ():
            callback(moves)
        state.page_ids, state.residency = page_ids, Residency.PREPARING
        self.version += 1
        self._on_device[adapter_id] = None
        self.touch(adapter_id)
        return victims

    def _victims_for(
        self, num_pages: int, may_evict_waiting: bool, min_free_kv_blocks: int
    ) -> list[str] | None:
        """Fewest evictions (in eviction order) after which `num_pages` fit (a contiguous run, in a unified
        pool, possibly after moving up to `max_compaction_pages` KV pages out of it) while
        `min_free_kv_blocks` KV pages stay free (moving KV pages leaves their count as it is)."""
        pool = self.pool

        def fits(freed: list[int]) -> bool:
            # Unified: the adapter's pages come out of KV-addressable pages; static: out of its own share.
            num_free_kv = pool.num_free_blocks + (len(freed) - num_pages if pool.is_unified else 0)
            is_fitting = pool.can_reserve(num_pages, freed, self.max_compaction_pages)
            return num_free_kv >= min_free_kv_blocks and is_fitting

        freed: list[int] = []
        if fits(freed):
            return []
        victims: list[str] = []
        for adapter_id in self.eviction_order(may_evict_waiting):
            victims.append(adapter_id)
            freed += self._states[adapter_id].page_ids
            if fits(freed):
                return victims
        return None

    def eviction_order(self, may_evict_waiting: bool) -> list[str]:
        """Evictable device adapters, first to go first: idle ones in the policy's order, then (when
        `may_evict_waiting`) waiting-only ones in the policy's order.

        Never an adapter of a running request, nor one still PREPARING or COPYING.
        """
        device = [self._states[a] for a in self._on_device]  # least recently used first
        done = [s for s in device if s.residency is Residency.DEVICE and s.num_running == 0]
        idle = [s for s in done if s.num_waiting == 0]
        # Without a host copy an evicted adapter could not come back for the requests waiting on it.
        waiting = (
            [s for s in done if s.num_waiting > 0 and s.host_path is not None] if may_evict_waiting else []
        )
        if not idle and not waiting:
            return []
        view = self.cache_view()
        return self._ordered(idle, view) + self._ordered(waiting, view)

    def _ordered(self, states: list[AdapterState], view: CacheView) -> list[str]:
        if len(states) <= 1:
            return [s.adapter_id for s in states]
        return self.policy.order([self.candidate(s) for s in states], view)

    def drop_idle_adapters(self) -> list[str]:
        """Without the adapter cache: evict every device adapter that no request or lease pins; returns their
        ids (always [] when caching idle adapters). An adapter being loaded stays until its copy lands."""
        if self.is_caching_idle_adapters:
            return []
        idle = [
            adapter_id
            for adapter_id in self._on_device
            if self._states[adapter_id].residency is Residency.DEVICE
            and not self._states[adapter_id].is_pinned
        ]
        for adapter_id in idle:
            self.evict(adapter_id)
        return idle

    def evict_for_kv(self, num_blocks: int, keep: str | None = None) -> list[str]:
        """Evict adapters holding KV-addressable pages (unified pool; idle first, then waiting-only; never
        `keep`) until `num_blocks` KV pages are free; returns the evicted ids (possibly short of the goal)."""
        victims: list[str] = []
        for adapter_id in self.eviction_order(may_evict_waiting=True):
            if self.pool.num_free_blocks >= num_blocks:
                break
            if adapter_id != keep and self.pool.num_kv_addressable(self._states[adapter_id].page_ids):
                self.evict(adapter_id)
                victims.append(adapter_id)
        return victims

    # ---- carrying out ---------------------------------------------------------------------------------

    def mark_prepared(self, adapter_id: str) -> None:
        """The engine made the adapter's host copy (PREPARING -> COPYING): its copy to the device runs."""
        state = self._states[adapter_id]
        if state.residency is Residency.PREPARING:
            state.residency = Residency.COPYING

    def mark_loaded(self, adapter_id: str, load_seconds: float | None = None) -> None:
        """The engine finished copying the adapter to the device (in `load_seconds`, when it measured)."""
        state = self._states[adapter_id]
        state.residency = Residency.DEVICE
        self.num_loads += 1
        state.num_loads += 1
        if load_seconds is not None:
            state.load_seconds = load_seconds
            self.num_timed_loads += 1
            self.load_seconds_total += load_seconds

    def cancel_load(self, adapter_id: str) -> None:
        """A planned load failed (its preparation or its copy): release its pages; it stays on the host."""
        self._drop_from_device(self._states[adapter_id])

    def evict(self, adapter_id: str) -> None:
        """Release the adapter's pages; it goes back to HOST (NONE when it has no host copy)."""
        self._drop_from_device(self._states[adapter_id])
        self.num_evictions += 1

    def _drop_from_device(self, state: AdapterState) -> None:
        for callback in self.on_leave_device:
            callback(state.adapter_id)
        if state.page_ids:
            self.pool.release(state.page_ids)
            state.page_ids = []
        self._on_device.pop(state.adapter_id, None)
        state.residency = Residency.HOST if state.host_path is not None else Residency.NONE
        self.version += 1

    def forget(self, adapter_id: str) -> None:
        """Evict (if resident) and drop the adapter from the registry."""
        if adapter_id in self._on_device:
            self.evict(adapter_id)
        self._states.pop(adapter_id, None)
        self.version += 1
