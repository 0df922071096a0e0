"""The analytic memory check: a GPU's adapter cache (a static split of the profile's device memory, in pool
pages as the engine cuts adapters) plus a minimum KV pool must fit. The minimum KV pool holds
`min_kv_sequences` requests of p99 prompt + p99 output length, so a planned GPU can always run a batch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scheduler.core.page_pool import num_pages_for_adapter
from twin.planner.workload import PlannedAdapter, Workload
from twin.profile import TwinProfile

DEFAULT_MIN_KV_SEQUENCES = 8


@dataclass(frozen=True)
class MemoryCheck:
    """Bytes of one GPU's plan: the adapter cache, the KV left beside it and the KV it needs."""

    is_fitting: bool
    cache_bytes: int
    kv_bytes: int
    min_kv_bytes: int
    reason: str = ""


def page_bytes(profile: TwinProfile) -> int:
    """One pool page (one KV block)."""
    return profile.kv_bytes_per_token * profile.memory.block_size


def adapter_device_bytes(profile: TwinProfile, adapter: PlannedAdapter) -> int:
    """The adapter's device bytes: its own, else the profile model's for its rank."""
    return adapter.num_bytes if adapter.num_bytes is not None else profile.model.adapter_bytes(adapter.rank)


def adapter_cache_bytes(profile: TwinProfile, adapter: PlannedAdapter) -> int:
    """The pool bytes the adapter takes when resident (whole pages, cut by rank rows)."""
    pages = num_pages_for_adapter(adapter.rank, adapter_device_bytes(profile, adapter), page_bytes(profile))
    return pages * page_bytes(profile)


def cache_bytes_for_slots(profile: TwinProfile, adapters: Sequence[PlannedAdapter], num_slots: int) -> int:
    """A cache that holds any `num_slots` of `adapters` at once (the largest ones)."""
    sizes = sorted((adapter_cache_bytes(profile, a) for a in adapters), reverse=True)
    return sum(sizes[: max(1, num_slots)])


def min_kv_bytes(profile: TwinProfile, workload: Workload, min_kv_sequences: int) -> int:
    """KV bytes for `min_kv_sequences` requests of p99 length."""
    tokens = workload.prompt_tokens.quantile(0.99) + workload.output_tokens.quantile(0.99)
    return int(min_kv_sequences * tokens * profile.kv_bytes_per_token)


def check_memory(
    profile: TwinProfile,
    workload: Workload,
    adapters: Sequence[PlannedAdapter],
    cache_bytes: int,
    *,
    min_kv_sequences: int = DEFAULT_MIN_KV_SEQUENCES,
) -> MemoryCheck:
    """Does an adapter cache of `cache_bytes` (holding the largest of `adapters`) leave the minimum KV pool?"""
    kv_bytes = profile.memory.device_bytes - cache_bytes
    need_kv = min_kv_bytes(profile, workload, min_kv_sequences)
    largest = max((adapter_cache_bytes(profile, a) for a in adapters), default=0)
    reason = ""
    if cache_bytes < largest:
        reason = f"the adapter cache ({cache_bytes} B) cannot hold the largest adapter ({largest} B)"
    elif kv_bytes < need_kv:
        reason = (
            f"the adapter cache ({cache_bytes} B) leaves {max(kv_bytes, 0)} B of KV, below the "
            f"{need_kv} B that {min_kv_sequences} p99-length requests need"
        )
    return MemoryCheck(not reason, cache_bytes, kv_bytes, need_kv, reason)
