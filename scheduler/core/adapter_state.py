"""The plain data of adapter residency (scheduler/core/adapter_residency.py owns the transitions): where an
adapter's weights are, and what the core tracks per adapter."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Residency(Enum):
    """Where an adapter's weights are."""

    NONE = "none"
    HOST = "host"
    PREPARING = "preparing"
    COPYING = "copying"
    DEVICE = "device"


# Residencies of an adapter whose pages are reserved: on the device, or a planned load under way.
RESERVED_RESIDENCIES = frozenset({Residency.PREPARING, Residency.COPYING, Residency.DEVICE})


@dataclass
class AdapterState:
    """What the core tracks per adapter (plain data; the engine holds the tensors)."""

    adapter_id: str
    host_path: str | None
    rank: int
    num_bytes: int  # device bytes (used for its pages)
    num_pages: int | None = None  # exact pages from the engine's tensor layout; None: cut by rank rows
    residency: Residency = Residency.HOST
    page_ids: list[int] = field(default_factory=list)
    num_running: int = 0
    num_waiting: int = 0
    last_use: float = 0.0  # clock seconds of the last access, pin or load
    load_seconds: float | None = None  # measured host-to-device load time (None until one is measured)
    num_loads: int = 0  # copies to the device since it was registered (its cold starts on this worker)

    @property
    def is_pinned(self) -> bool:
        """True while any request or lease uses the adapter."""
        return self.num_running > 0 or self.num_waiting > 0
