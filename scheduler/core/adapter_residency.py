"""Adapter residency: which adapters are on the host, being copied, or on the device, and who pins them.

The core (not the worker, not the model runner) decides what is resident. Every adapter the engine knows
has a host copy (`host_path`, fetched and verified by the worker) and a state:

    NONE -> HOST (registered) -> COPYING (pages reserved, copy planned) -> DEVICE -> HOST (evicted)

Pins: `num_running` counts running sequences (never evicted), `num_waiting` counts waiting sequences and
external leases (a worker request between admission and entering the engine, a prefetch): evicted only when
a request ahead of them needs the room. Idle adapters (no pin) are evicted least recently used first.
Device bytes come from the one page pool (`PagePool.reserve`); `max_device_adapters` is a policy cap on the
count kept from before the pool owned adapter memory (the [Adapter memory] issue replaces it and the LRU
order with a cost-aware `EvictionPolicy`; `eviction_order` is where that plugs in).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from scheduler.core.page_pool import PagePool, num_pages_for_adapter


class Residency(Enum):
    """Where an adapter's weights are."""

    NONE = "none"
    HOST = "host"
    COPYING = "copying"
    DEVICE = "device"


@dataclass
class AdapterState:
    """What the core tracks per adapter (plain data; the engine holds the tensors)."""

    adapter_id: str
    host_path: str | None
    rank: int
    num_bytes: int  # device bytes (used for its pages)
    residency: Residency = Residency.HOST
    page_ids: list[int] = field(default_factory=list)
    num_running: int = 0
    num_waiting: int = 0

    @property
    def is_pinned(self) -> bool:
        """True while any request or lease uses the adapter."""
        return self.num_running > 0 or self.num_waiting > 0


class AdapterResidency:
    """Registry of adapters with their residency, pages and pins; plans loads and evictions."""

    def __init__(self, pool: PagePool, page_bytes: int, max_device_adapters: int) -> None:
        if page_bytes <= 0 or max_device_adapters <= 0:
            raise ValueError("page_bytes and max_device_adapters must be positive")
        self.pool = pool
        self.page_bytes = page_bytes
        self.max_device_adapters = max_device_adapters
        self._states: dict[str, AdapterState] = {}
        # Device-side adapters (COPYING or DEVICE), least recently used first.
        self._on_device: OrderedDict[str, None] = OrderedDict()
        self.num_loads = 0
        self.num_evictions = 0
        # Called with an adapter id whenever it leaves the device (evict, forget, failed copy), before its
        # pages go back: the prefix cache drops the adapter's KV blocks there (no KV outlives its adapter).
        self.on_leave_device: list[Callable[[str], None]] = []

    # ---- registry -----------------------------------------------------------------------------------

    def register(self, adapter_id: str, host_path: str | None, rank: int, num_bytes: int) -> AdapterState:
        """Record (or update) an adapter's host copy; a device-resident adapter keeps its residency."""
        state = self._states.get(adapter_id)
        if state is None:
            state = AdapterState(adapter_id, host_path, rank, num_bytes)
            self._states[adapter_id] = state
        elif state.residency is Residency.NONE or state.residency is Residency.HOST:
            state.host_path, state.rank, state.num_bytes = host_path, rank, num_bytes
            state.residency = Residency.HOST
        return state

    def get(self, adapter_id: str) -> AdapterState | None:
        """The adapter's state, or None when the engine never saw it."""
        return self._states.get(adapter_id)

    def residency(self, adapter_id: str) -> Residency:
        """NONE for unknown adapters."""
        state = self._states.get(adapter_id)
        return Residency.NONE if state is None else state.residency

    def device_adapters(self) -> list[str]:
        """Adapters on the device or being copied there, least recently used first."""
        return list(self._on_device)

    def num_device_bytes(self) -> int:
        """Bytes of the adapters on the device (or being copied)."""
        return sum(self._states[a].num_bytes for a in self._on_device)

    def touch(self, adapter_id: str) -> None:
        """Mark as most recently used."""
        if adapter_id in self._on_device:
            self._on_device.move_to_end(adapter_id)

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
        return num_pages_for_adapter(state.rank, state.num_bytes, self.page_bytes)

    def plan_load(self, adapter_id: str, may_evict_waiting: bool) -> list[str] | None:
        """Reserve room for a host adapter and mark it COPYING; returns the adapters evicted to make room.

        Idle adapters go first (LRU), then, when `may_evict_waiting`, adapters only waiting requests use.
        None (and nothing changed) when it cannot fit; an adapter already on the device returns [].
        """
        state = self._states[adapter_id]
        if state.residency in (Residency.COPYING, Residency.DEVICE):
            self.touch(adapter_id)
            return []
        num_pages = self.num_pages_for(state)
        victims = self._victims_for(num_pages, may_evict_waiting)
        if victims is None:
            return None
        for victim in victims:
            self.evict(victim)
        page_ids = self.pool.reserve(num_pages)
        assert page_ids is not None, "victims were chosen so that the pages fit"
        state.page_ids, state.residency = page_ids, Residency.COPYING
        self._on_device[adapter_id] = None
        return victims

    def _victims_for(self, num_pages: int, may_evict_waiting: bool) -> list[str] | None:
        """Fewest evictions (in eviction order) after which `num_pages` and one more adapter fit."""
        num_free = self.pool.num_free_pages
        num_slots = self.max_device_adapters - len(self._on_device)
        victims: list[str] = []
        for adapter_id in self.eviction_order(may_evict_waiting):
            if num_free >= num_pages and num_slots > 0:
                break
            victims.append(adapter_id)
            num_free += len(self._states[adapter_id].page_ids)
            num_slots += 1
        return victims if num_free >= num_pages and num_slots > 0 else None

    def eviction_order(self, may_evict_waiting: bool) -> list[str]:
        """Evictable device adapters, first to go first: idle by LRU, then waiting-only by LRU.

        Never an adapter of a running request, nor one still COPYING. A cost-aware policy (Chameleon's
        frequency/recency/size score, FastLibra's Eval) replaces this order in the [Adapter memory] issue.
        """
        device = [self._states[a] for a in self._on_device]
        done = [s for s in device if s.residency is Residency.DEVICE and s.num_running == 0]
        idle = [s.adapter_id for s in done if s.num_waiting == 0]
        # Without a host copy an evicted adapter could not come back for the requests waiting on it.
        has_host = [s for s in done if s.num_waiting > 0 and s.host_path is not None]
        waiting = [s.adapter_id for s in has_host] if may_evict_waiting else []
        return idle + waiting

    def evict_for_kv(self, num_blocks: int, keep: str | None = None) -> list[str]:
        """Evict adapters holding KV-addressable pages (idle first, then waiting-only; never `keep`) until
        `num_blocks` KV pages are free; returns the evicted ids (possibly without reaching the goal)."""
        victims: list[str] = []
        for adapter_id in self.eviction_order(may_evict_waiting=True):
            if self.pool.num_free_blocks >= num_blocks:
                break
            # Evicting an adapter frees KV pages directly, or makes room for spilled adapter pages to move.
            if adapter_id != keep and (self.pool.num_spilled_adapter_pages or self._num_in_kv(adapter_id)):
                self.evict(adapter_id)
                victims.append(adapter_id)
        return victims

    def _num_in_kv(self, adapter_id: str) -> int:
        return self.pool.num_kv_addressable(self._states[adapter_id].page_ids)

    def _move_spilled_pages(self) -> None:
        """Move adapter pages that spilled into KV-addressable pages to free adapter-only pages."""
        if not self.pool.num_spilled_adapter_pages:
            return
        for adapter_id in self._on_device:
            page_ids = self._states[adapter_id].page_ids
            for i, page in enumerate(page_ids):
                if page < self.pool.max_kv_pages:
                    new_page = self.pool.move_out_of_kv(page)
                    if new_page is None:
                        return
                    page_ids[i] = new_page

    # ---- carrying out ---------------------------------------------------------------------------------

    def mark_loaded(self, adapter_id: str) -> None:
        """The engine finished copying the adapter to the device."""
        self._states[adapter_id].residency = Residency.DEVICE
        self.num_loads += 1

    def cancel_load(self, adapter_id: str) -> None:
        """A planned copy failed: release its pages; the adapter stays on the host."""
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
        self._move_spilled_pages()

    def forget(self, adapter_id: str) -> None:
        """Evict (if resident) and drop the adapter from the registry."""
        if adapter_id in self._on_device:
            self.evict(adapter_id)
        self._states.pop(adapter_id, None)
