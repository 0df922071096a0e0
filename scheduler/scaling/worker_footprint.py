"""How much memory one engine worker holds, and how to size its pools to fit what is left of a budget (issue 33
item 4): pure, no I/O.

A native worker holds (each counted, none estimated from the weights alone):
- its base model's weights (the safetensors bytes, rescaled to the engine's element size);
- its page pool (scheduler/core/memory_geometry.py): the KV tensor of `num_kv_blocks` pages, plus in a unified
  pool the `adapter_cache_bytes` worth of pages, plus in a static split its adapter-only pages (allocated as
  adapters arrive, counted at their most);
- its host adapter tier (`host_adapter_cache_bytes`: packed host copies of adapters, counted at their most);
- an activation overhead: the largest step's live temporaries. The engine bounds a step to
  `max_num_batched_tokens` tokens, so this is bounded too: per token the residual stream and its norm, the
  q/k/v/o projections and the MLP's gate, up and product (`ACTIVATION_ROWS_PER_TOKEN`), plus fp32 logits of
  one token per running sequence. Attention scores are not counted (SDPA computes them blockwise); this is an
  estimate of an order of magnitude, the pools above are exact.

`fit_worker` sizes a worker to at most `max_bytes`: its configured pools when they fit; else the host tier
shrinks first (a cache only: a later copy of an adapter reads its files again), then the KV pool, down to
`min_kv_blocks`: one request of the model's full context (capped at `MIN_CONTEXT_TOKENS`) with an adapter of the
largest rank beside it in a unified pool. Below that it answers None: the worker is not started.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.core.memory_geometry import MemoryGeometry, ModelShape
from scheduler.core.page_pool import num_pages_for_adapter

MIN_CONTEXT_TOKENS = (
    2048  # the smallest KV pool serves one request of this many tokens (or the model's context)
)
ACTIVATION_ROWS_PER_TOKEN = 3  # residual stream, its norm and one projection's output live at once per layer
LOGIT_ELEMENT_BYTES = 4  # logits are sampled in fp32
GIB = 1 << 30


@dataclass(frozen=True)
class PoolKnobs:
    """The engine settings that size a worker's memory (settings/engine.py; block_size: EngineConfig's)."""

    block_size: int
    memory_mode: str
    kv_cache_bytes: int
    num_kv_blocks: int | None
    adapter_cache_bytes: int | None
    max_lora_rank: int
    max_model_len: int | None
    host_adapter_cache_bytes: int
    max_num_batched_tokens: int
    max_num_seqs: int


@dataclass(frozen=True)
class WorkerFootprint:
    """The memory one worker holds (module doc) and the pool sizes that give it."""

    weight_bytes: int
    kv_pool_bytes: int  # the KV tensor (in a unified pool: KV budget + adapter budget)
    adapter_pool_bytes: int  # a static split's adapter-only pages, at their most; 0 in a unified pool
    host_tier_bytes: int  # the host adapter tier, at its most
    activation_bytes: int  # the largest step's temporaries (estimate)
    num_kv_blocks: (
        int  # the KV budget in blocks to configure (engine_num_kv_blocks; without unified adapter pages)
    )

    @property
    def num_bytes(self) -> int:
        """Everything the worker holds."""
        return (
            self.weight_bytes
            + self.kv_pool_bytes
            + self.adapter_pool_bytes
            + self.host_tier_bytes
            + self.activation_bytes
        )

    def describe(self) -> str:
        """One line for logs and errors: the total and each part."""
        parts = (
            f"weights {gib(self.weight_bytes)}, KV pool {gib(self.kv_pool_bytes)} ({self.num_kv_blocks} blocks), "
            f"adapter pool {gib(self.adapter_pool_bytes)}, host adapter tier {gib(self.host_tier_bytes)}, "
            f"activations {gib(self.activation_bytes)}"
        )
        return f"{gib(self.num_bytes)} ({parts})"


def gib(num_bytes: int) -> str:
    """Bytes for people: GiB with two decimals, MiB below one GiB."""
    if num_bytes >= GIB:
        return f"{num_bytes / GIB:.2f} GiB"
    return f"{num_bytes / (1 << 20):.1f} MiB"


def configured_kv_blocks(shape: ModelShape, element_size: int, knobs: PoolKnobs) -> int:
    """The KV budget in blocks as configured: `num_kv_blocks`, else `kv_cache_bytes` cut into blocks."""
    if knobs.num_kv_blocks is not None:
        return knobs.num_kv_blocks
    return max(1, knobs.kv_cache_bytes // (shape.kv_bytes_per_token(element_size) * knobs.block_size))


def min_kv_blocks(shape: ModelShape, element_size: int, knobs: PoolKnobs) -> int:
    """The smallest KV budget that still serves a request (module doc), never above the configured one."""
    context = min(knobs.max_model_len or shape.max_position_embeddings, MIN_CONTEXT_TOKENS)
    blocks = -(-context // knobs.block_size)
    if knobs.memory_mode == "unified" and knobs.adapter_cache_bytes is None:  # adapters take KV pages
        page_bytes = shape.kv_bytes_per_token(element_size) * knobs.block_size
        rank = knobs.max_lora_rank
        blocks += num_pages_for_adapter(rank, rank * shape.adapter_row_bytes(element_size), page_bytes)
    return min(blocks, configured_kv_blocks(shape, element_size, knobs))


def activation_bytes(shape: ModelShape, element_size: int, knobs: PoolKnobs) -> int:
    """The activation overhead estimate (module doc)."""
    q_out, kv_out = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    widest = max(shape.hidden_size, q_out + 2 * kv_out, 2 * shape.intermediate_size)
    per_token = (ACTIVATION_ROWS_PER_TOKEN * shape.hidden_size + widest) * element_size
    logits = knobs.max_num_seqs * shape.vocab_size * LOGIT_ELEMENT_BYTES
    return knobs.max_num_batched_tokens * per_token + logits


def worker_footprint(
    shape: ModelShape,
    *,
    element_size: int,
    weight_bytes: int,
    knobs: PoolKnobs,
    num_kv_blocks: int | None = None,
    host_tier_bytes: int | None = None,
) -> WorkerFootprint:
    """The footprint of a worker with `num_kv_blocks` KV blocks and a host tier of `host_tier_bytes` (None: as
    configured), its page pool cut exactly as the engine cuts it (MemoryGeometry.plan)."""
    blocks = configured_kv_blocks(shape, element_size, knobs) if num_kv_blocks is None else num_kv_blocks
    geometry = MemoryGeometry.plan(
        shape,
        element_size=element_size,
        block_size=knobs.block_size,
        memory_mode=knobs.memory_mode,
        kv_cache_bytes=knobs.kv_cache_bytes,
        num_kv_blocks=blocks,
        adapter_cache_bytes=knobs.adapter_cache_bytes,
        max_lora_rank=knobs.max_lora_rank,
        max_model_len=knobs.max_model_len,
    )
    return WorkerFootprint(
        weight_bytes=weight_bytes,
        kv_pool_bytes=geometry.num_kv_blocks * geometry.kv_bytes_per_block,
        adapter_pool_bytes=geometry.num_adapter_pages * geometry.kv_bytes_per_block,
        host_tier_bytes=knobs.host_adapter_cache_bytes if host_tier_bytes is None else host_tier_bytes,
        activation_bytes=activation_bytes(shape, element_size, knobs),
        num_kv_blocks=blocks,
    )


def fit_worker(
    shape: ModelShape, *, element_size: int, weight_bytes: int, knobs: PoolKnobs, max_bytes: int | None
) -> WorkerFootprint | None:
    """The largest footprint within `max_bytes` (None: no bound): the configured pools, else a smaller host
    tier, then a smaller KV pool down to `min_kv_blocks`; None when even that does not fit (module doc)."""
    full = worker_footprint(shape, element_size=element_size, weight_bytes=weight_bytes, knobs=knobs)
    if max_bytes is None or full.num_bytes <= max_bytes:
        return full
    deficit = full.num_bytes - max_bytes
    host_tier = max(0, full.host_tier_bytes - deficit)
    deficit -= full.host_tier_bytes - host_tier
    if deficit <= 0:
        return _footprint(shape, element_size, weight_bytes, knobs, full.num_kv_blocks, host_tier)
    block_bytes = shape.kv_bytes_per_token(element_size) * knobs.block_size
    blocks = full.num_kv_blocks - -(-deficit // block_bytes)
    if blocks < min_kv_blocks(shape, element_size, knobs):
        return None
    return _footprint(shape, element_size, weight_bytes, knobs, blocks, 0)


def smallest_worker(
    shape: ModelShape, *, element_size: int, weight_bytes: int, knobs: PoolKnobs
) -> WorkerFootprint:
    """The footprint at `min_kv_blocks` and no host tier: the least memory a worker of this model starts with."""
    blocks = min_kv_blocks(shape, element_size, knobs)
    return _footprint(shape, element_size, weight_bytes, knobs, blocks, 0)


def _footprint(
    shape: ModelShape, element_size: int, weight_bytes: int, knobs: PoolKnobs, blocks: int, host_tier: int
) -> WorkerFootprint:
    return worker_footprint(
        shape,
        element_size=element_size,
        weight_bytes=weight_bytes,
        knobs=knobs,
        num_kv_blocks=blocks,
        host_tier_bytes=host_tier,
    )
