"""The memory side of `lorahost serve`'s in-process workers (issue 33 item 4): the machine's memory, the budget,
and each model's worker footprint from the settings and the model's shape (the arithmetic is
scheduler/scaling/worker_footprint.py, pure).

The budget is `settings.worker.embedded_memory_bytes` (LORAHOST_WORKER_EMBEDDED_MEMORY_BYTES) when set, else
`embedded_memory_fraction` (default 0.5) of the memory available to this process: the cgroup's limit when one is
set (v2 `memory.max`, v1 `memory.limit_in_bytes`), else MemTotal of /proc/meminfo, else the physical pages
(os.sysconf); the smallest of those that are known.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scheduler.core.memory_geometry import ModelShape
from scheduler.scaling.worker_footprint import (
    PoolKnobs,
    WorkerFootprint,
    fit_worker,
    smallest_worker,
    worker_footprint,
)
from settings import Settings

ReadText = Callable[[str], str | None]
CGROUP_V2_MAX = "/sys/fs/cgroup/memory.max"
CGROUP_V1_LIMIT = "/sys/fs/cgroup/memory/memory.limit_in_bytes"
MEMINFO = "/proc/meminfo"
ENGINE_BLOCK_SIZE = 16  # gpu_workers.engine.config.EngineConfig.block_size (not an operator setting)
FILE_ELEMENT_SIZES = {"float16": 2, "bfloat16": 2, "float32": 4}
DEFAULT_CONTEXT = 4096  # a config without max_position_embeddings (as ModelShape.from_hf_config)


def read_text(path: str) -> str | None:
    """A small system file's text, None when it cannot be read."""
    try:
        return Path(path).read_text()
    except OSError:
        return None


def physical_memory_bytes() -> int | None:
    """The machine's physical memory by os.sysconf (None where it is not known)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def machine_memory_bytes(
    read: ReadText = read_text, physical: Callable[[], int | None] = physical_memory_bytes
) -> int | None:
    """The memory available to this process (module doc); None when nothing says."""
    total = _meminfo_total(read)
    known = [n for n in (_cgroup_limit(read), total if total is not None else physical()) if n is not None]
    return min(known) if known else None


def _cgroup_limit(read: ReadText) -> int | None:
    for path in (CGROUP_V2_MAX, CGROUP_V1_LIMIT):
        text = (read(path) or "").strip()
        if text.isdigit() and int(text) < 1 << 60:  # "max" (v2) or a huge sentinel (v1): no limit
            return int(text)
    return None


def _meminfo_total(read: ReadText) -> int | None:
    for line in (read(MEMINFO) or "").splitlines():
        fields = line.split()
        if fields[:1] == ["MemTotal:"] and len(fields) >= 2 and fields[1].isdigit():
            return int(fields[1]) * (1024 if fields[2:3] == ["kB"] else 1)
    return None


def embedded_budget_bytes(settings: Settings, read: ReadText = read_text) -> int | None:
    """The in-process workers' budget (module doc); None only when the machine's memory is unknown and no
    budget is set."""
    if settings.worker.embedded_memory_bytes is not None:
        return settings.worker.embedded_memory_bytes
    total = machine_memory_bytes(read)
    return None if total is None else int(total * settings.worker.embedded_memory_fraction)


def pool_knobs(settings: Settings) -> PoolKnobs:
    """The engine settings that size a worker's memory."""
    engine = settings.engine
    return PoolKnobs(
        block_size=ENGINE_BLOCK_SIZE,
        memory_mode=engine.memory_mode,
        kv_cache_bytes=engine.kv_cache_bytes,
        num_kv_blocks=engine.num_kv_blocks,
        adapter_cache_bytes=engine.adapter_cache_bytes,
        max_lora_rank=settings.resolved_max_lora_rank(),
        max_model_len=engine.max_model_len,
        host_adapter_cache_bytes=engine.host_adapter_cache_bytes,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        max_num_seqs=engine.max_num_seqs,
    )


def engine_element_size(settings: Settings) -> int:
    """Bytes of one element in the engine's dtype (auto: as the engine resolves it on this machine)."""
    if settings.engine.dtype in FILE_ELEMENT_SIZES:
        return FILE_ELEMENT_SIZES[settings.engine.dtype]
    from gpu_workers.engine.config import EngineConfig

    config = EngineConfig.from_section(
        settings.engine, model_path=Path("."), max_lora_rank=settings.resolved_max_lora_rank()
    )
    return int(config.resolved_dtype().itemsize)


@dataclass(frozen=True)
class ModelSizing:
    """What a worker's footprint depends on besides the settings: the model's shape and its weights' bytes in
    the engine's dtype."""

    shape: ModelShape
    weight_bytes: int

    @classmethod
    def from_catalog(
        cls, shape: dict[str, int], dtype: str, files: list[dict[str, Any]], element_size: int
    ) -> ModelSizing:
        """From a catalog row's shape, dtype and file records (registry.models.CatalogModel; the files' sizes
        include their safetensors headers, a few KiB over the tensors)."""
        num_bytes = sum(int(f["num_bytes"]) for f in files if str(f["path"]).endswith(".safetensors"))
        return cls(_catalog_shape(shape), _rescaled(num_bytes, dtype, element_size))

    @classmethod
    def from_model_dir(cls, model_dir: Path, element_size: int) -> ModelSizing:
        """From a local model directory (config.json and *.safetensors)."""
        import json

        config = json.loads((Path(model_dir) / "config.json").read_text())
        num_bytes = sum(_tensor_bytes(p) for p in Path(model_dir).glob("*.safetensors"))
        dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32")
        return cls(ModelShape.from_hf_config(config), _rescaled(num_bytes, dtype, element_size))

    def fit(self, settings: Settings, element_size: int, max_bytes: int | None) -> WorkerFootprint | None:
        """The largest footprint within `max_bytes` (scheduler/scaling/worker_footprint.py fit_worker)."""
        return fit_worker(
            self.shape,
            element_size=element_size,
            weight_bytes=self.weight_bytes,
            knobs=pool_knobs(settings),
            max_bytes=max_bytes,
        )

    def full(self, settings: Settings, element_size: int) -> WorkerFootprint:
        """The footprint at the configured pool sizes."""
        return worker_footprint(
            self.shape, element_size=element_size, weight_bytes=self.weight_bytes, knobs=pool_knobs(settings)
        )

    def smallest(self, settings: Settings, element_size: int) -> WorkerFootprint:
        """The least memory a worker of this model starts with."""
        return smallest_worker(
            self.shape, element_size=element_size, weight_bytes=self.weight_bytes, knobs=pool_knobs(settings)
        )


def sized_settings(settings: Settings, footprint: WorkerFootprint) -> Settings:
    """The worker's settings with its pools sized to `footprint` (its KV blocks and host adapter tier)."""
    return settings.updated(
        engine_num_kv_blocks=footprint.num_kv_blocks,
        engine_host_adapter_cache_bytes=footprint.host_tier_bytes,
    )


def _tensor_bytes(path: Path) -> int:
    """The tensor bytes of a safetensors file: its size less its header (an 8-byte length, then JSON)."""
    with path.open("rb") as f:
        header = int.from_bytes(f.read(8), "little")
    return max(0, path.stat().st_size - 8 - header)


def _catalog_shape(shape: dict[str, int]) -> ModelShape:
    return ModelShape(
        num_layers=int(shape["num_layers"]),
        hidden_size=int(shape["hidden_size"]),
        num_heads=int(shape["num_heads"]),
        num_kv_heads=int(shape["num_kv_heads"]),
        head_dim=int(shape["head_dim"]),
        intermediate_size=int(shape["intermediate_size"]),
        vocab_size=int(shape["vocab_size"]),
        max_position_embeddings=int(shape.get("max_position_embeddings") or DEFAULT_CONTEXT),
    )


def _rescaled(num_bytes: int, dtype: str, element_size: int) -> int:
    """Bytes of weights stored in `dtype` once loaded in the engine's element size."""
    return -(-num_bytes * element_size // FILE_ELEMENT_SIZES.get(dtype, 4))
