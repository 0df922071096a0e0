"""A worker's memory counted whole (lorahost/worker_memory.py, scheduler/scaling/worker_footprint.py): the footprint of a
tiny engine equals the tensors the built engine allocates, pools shrink to what is left down to one request's
worth, and the default budget is a share of the memory the process may use (cgroup limit, else MemTotal)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_workers.engine.model_runner import ModelRunner
from gpu_workers.worker.builder import engine_config_from_settings
from lorahost.worker_memory import (
    CGROUP_V1_LIMIT,
    CGROUP_V2_MAX,
    MEMINFO,
    ModelSizing,
    embedded_budget_bytes,
    machine_memory_bytes,
    pool_knobs,
    sized_settings,
)
from scheduler.scaling.worker_footprint import MIN_CONTEXT_TOKENS, activation_bytes, min_kv_blocks
from settings import Settings

GIB = 1 << 30
MEMINFO_16G = "MemTotal:       16384000 kB\nMemFree:         1000000 kB\n"


def _reader(files: dict[str, str]):  # type: ignore[no-untyped-def]
    return lambda path: files.get(path)


def _allocated(runner: ModelRunner) -> tuple[int, int]:
    """(weight bytes, KV pool bytes) of the tensors a built engine holds."""
    weights = sum(t.numel() * t.element_size() for t in runner.model.state_dict().values())
    kv = sum(t.numel() * t.element_size() for pair in runner.kv_caches for t in pair)
    return weights, kv


@pytest.mark.parametrize("memory_mode", ["unified", "static"])
def test_a_workers_footprint_counts_the_tensors_its_engine_allocates(
    tmp_path: Path, base_model_dir: Path, memory_mode: str
) -> None:
    settings = Settings(
        data_dir=tmp_path,
        base_model_path=base_model_dir,
        engine_dtype="float32",
        engine_num_threads=1,
        engine_kv_cache_bytes=3 << 20,
        engine_adapter_cache_bytes=1 << 20,
        engine_memory_mode=memory_mode,
        engine_host_adapter_cache_bytes=5 << 20,
        engine_linear_weights="plain",
    )
    sizing = ModelSizing.from_model_dir(base_model_dir, element_size=4)
    full = sizing.full(settings, 4)
    runner = ModelRunner(engine_config_from_settings(settings))
    assert _allocated(runner) == (full.weight_bytes, full.kv_pool_bytes)
    assert full.adapter_pool_bytes == runner.num_adapter_pages() * runner.kv_bytes_per_block()
    assert (full.adapter_pool_bytes >= 1 << 20) == (memory_mode == "static")  # unified: inside the KV pool
    assert full.host_tier_bytes == runner.transfers.host_tier.max_bytes == 5 << 20
    assert full.activation_bytes == activation_bytes(sizing.shape, 4, pool_knobs(settings)) > 0
    assert full.num_bytes == sum(
        (full.weight_bytes, full.kv_pool_bytes, full.adapter_pool_bytes, 5 << 20, full.activation_bytes)
    )
    # sized to less than its configured pools: the host tier goes first, then the KV pool
    smaller = sizing.fit(settings, 4, full.num_bytes - (5 << 20) - (1 << 20))
    assert smaller is not None and smaller.host_tier_bytes == 0 and smaller.num_kv_blocks < full.num_kv_blocks
    assert smaller.num_bytes <= full.num_bytes - (6 << 20)
    sized = ModelRunner(engine_config_from_settings(sized_settings(settings, smaller)))
    assert _allocated(sized) == (smaller.weight_bytes, smaller.kv_pool_bytes)
    assert sized.transfers.host_tier.max_bytes == 0


def test_pools_shrink_no_further_than_one_request_of_the_models_context(base_model_dir: Path) -> None:
    settings = Settings(base_model_path=base_model_dir, engine_dtype="float32", engine_max_lora_rank=8)
    sizing = ModelSizing.from_model_dir(base_model_dir, element_size=4)
    knobs = pool_knobs(settings)
    smallest = sizing.smallest(settings, 4)
    context = min(sizing.shape.max_position_embeddings, MIN_CONTEXT_TOKENS)
    assert smallest.num_kv_blocks == min_kv_blocks(sizing.shape, 4, knobs) > context // knobs.block_size
    assert smallest.host_tier_bytes == 0
    assert sizing.fit(settings, 4, smallest.num_bytes) == smallest
    assert sizing.fit(settings, 4, smallest.num_bytes - 1) is None  # below one request's worth: not started


def test_the_default_budget_is_a_share_of_the_memory_the_process_may_use() -> None:
    settings = Settings(worker_embedded_memory_fraction=0.5)
    meminfo_only = _reader({MEMINFO: MEMINFO_16G, CGROUP_V2_MAX: "max\n"})
    assert machine_memory_bytes(meminfo_only) == 16384000 * 1024
    assert embedded_budget_bytes(settings, meminfo_only) == 16384000 * 1024 // 2
    cgroup_v2 = _reader({MEMINFO: MEMINFO_16G, CGROUP_V2_MAX: f"{4 * GIB}\n"})
    assert embedded_budget_bytes(settings, cgroup_v2) == 2 * GIB  # the container's limit, not the host's
    cgroup_v1 = _reader({MEMINFO: MEMINFO_16G, CGROUP_V1_LIMIT: "9223372036854771712\n"})  # v1: no limit
    assert machine_memory_bytes(cgroup_v1) == 16384000 * 1024
    cgroup_v1_set = _reader({MEMINFO: MEMINFO_16G, CGROUP_V1_LIMIT: f"{6 * GIB}\n"})
    assert (
        embedded_budget_bytes(Settings(worker_embedded_memory_fraction=0.25), cgroup_v1_set) == 6 * GIB // 4
    )
    assert machine_memory_bytes(_reader({}), physical=lambda: 8 * GIB) == 8 * GIB  # no /proc: sysconf
    explicit = Settings(worker_embedded_memory_bytes=3 * GIB)
    assert embedded_budget_bytes(explicit, cgroup_v2) == 3 * GIB  # an operator's number wins
    assert Settings().worker.embedded_memory_fraction == 0.5
