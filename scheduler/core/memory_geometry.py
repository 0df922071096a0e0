"""Memory geometry of one engine: the model's shape (from its config.json) and how the device memory budget
cuts into KV blocks and adapter pages. Torch-free and parsed once, so the engine's model runner, the engine
core and the digital twin (twin/) size the same page pool from the same numbers.

Pages: one page holds one KV block (K and V of `block_size` tokens across all layers). In a static split the
pool is `num_kv_pages` KV pages plus `num_adapter_pages` pages only adapters use; in a unified pool adapters
take KV pages, and the KV tensor is the KV budget plus the adapter budget (`num_kv_blocks`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from scheduler.core.page_pool import num_pages_for_adapter

MemoryMode = Literal["static", "unified"]
MEMORY_MODES: tuple[MemoryMode, ...] = ("static", "unified")
DEFAULT_NUM_ADAPTERS_ROOM = 64  # static split, no adapter budget given: room for this many max-rank adapters


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a decoder-only transformer that memory and cost depend on."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> ModelShape:
        """Read a Hugging Face config dict (as the engine's model does: head_dim defaults to hidden / heads,
        kv heads to heads, the context to 4096)."""
        num_heads = int(cfg["num_attention_heads"])
        return cls(
            num_layers=int(cfg["num_hidden_layers"]),
            hidden_size=int(cfg["hidden_size"]),
            num_heads=num_heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
            head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // num_heads),
            intermediate_size=int(cfg["intermediate_size"]),
            vocab_size=int(cfg["vocab_size"]),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        )

    @classmethod
    def from_model_dir(cls, model_dir: Path | str) -> ModelShape:
        """Read `config.json` of a model directory."""
        return cls.from_hf_config(json.loads((Path(model_dir) / "config.json").read_text()))

    def kv_bytes_per_token(self, element_size: int) -> int:
        """Bytes of K and V of one token across all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * element_size

    def adapter_row_bytes(self, element_size: int) -> int:
        """Device bytes of one rank row of an adapter that targets every projection of every layer."""
        q_out, kv_out = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        h, i = self.hidden_size, self.intermediate_size
        per_layer = (
            (h + q_out) + 2 * (h + kv_out) + (q_out + h) + 2 * (h + i) + (i + h)
        )  # q k v o gate up down
        return self.num_layers * per_layer * element_size


@dataclass(frozen=True)
class MemoryGeometry:
    """How one engine's device memory is paged (module doc). Build it with `MemoryGeometry.plan`."""

    shape: ModelShape
    element_size: int
    block_size: int
    memory_mode: MemoryMode
    num_kv_blocks: int  # pages of the KV tensor (in a unified pool: KV budget + adapter budget)
    num_adapter_pages: int  # pages only adapters use (static split); 0 in a unified pool
    max_model_len: int

    @classmethod
    def plan(
        cls,
        shape: ModelShape,
        *,
        element_size: int,
        block_size: int,
        memory_mode: str,
        kv_cache_bytes: int,
        num_kv_blocks: int | None = None,
        adapter_cache_bytes: int | None = None,
        max_lora_rank: int,
        max_model_len: int | None = None,
    ) -> MemoryGeometry:
        """Cut the budgets into pages: `num_kv_blocks` (else `kv_cache_bytes`) KV blocks, plus
        `adapter_cache_bytes` in a unified pool; a static split gets `adapter_cache_bytes` of adapter pages,
        or room for DEFAULT_NUM_ADAPTERS_ROOM adapters of `max_lora_rank`. ValueError when the KV budget is
        smaller than one block or the memory mode is unknown."""
        if memory_mode not in MEMORY_MODES:
            raise ValueError(f"memory_mode must be one of {MEMORY_MODES}, got {memory_mode!r}")
        kv_bytes_per_block = shape.kv_bytes_per_token(element_size) * block_size
        if num_kv_blocks is None:
            num_kv_blocks = kv_cache_bytes // kv_bytes_per_block
            if num_kv_blocks < 1:
                raise ValueError(
                    "kv_cache_bytes is too small for one KV block; raise it or set num_kv_blocks"
                )
        is_unified = memory_mode == "unified"
        if is_unified and adapter_cache_bytes is not None:
            num_kv_blocks += -(-adapter_cache_bytes // kv_bytes_per_block)
        if is_unified:
            num_adapter_pages = 0
        elif adapter_cache_bytes is not None:
            num_adapter_pages = -(-adapter_cache_bytes // kv_bytes_per_block)
        else:
            row_bytes = shape.adapter_row_bytes(element_size)
            per_adapter = num_pages_for_adapter(max_lora_rank, max_lora_rank * row_bytes, kv_bytes_per_block)
            num_adapter_pages = DEFAULT_NUM_ADAPTERS_ROOM * per_adapter
        return cls(
            shape=shape,
            element_size=element_size,
            block_size=block_size,
            memory_mode="unified" if is_unified else "static",
            num_kv_blocks=int(num_kv_blocks),
            num_adapter_pages=int(num_adapter_pages),
            max_model_len=min(
                max_model_len or shape.max_position_embeddings, int(num_kv_blocks) * block_size
            ),
        )

    @property
    def is_unified(self) -> bool:
        """True when adapters live in the KV cache's pages."""
        return self.memory_mode == "unified"

    @property
    def kv_bytes_per_block(self) -> int:
        """Bytes of K and V for one block across all layers (one page)."""
        return self.shape.kv_bytes_per_token(self.element_size) * self.block_size

    @property
    def page_numel(self) -> int:
        """Elements of K (or of V) one page holds in one layer."""
        return self.block_size * self.shape.num_kv_heads * self.shape.head_dim

    @property
    def num_pool_pages(self) -> int:
        """Pages of the engine's page pool: the KV tensor's pages plus the static adapter pages."""
        return self.num_kv_blocks + self.num_adapter_pages

    def adapter_device_bytes(self, num_file_bytes: int, file_dtype: str) -> int:
        """Device bytes of an adapter whose weight file holds `num_file_bytes` of `file_dtype` (rescaled to
        the engine's element size)."""
        file_element = {"float16": 2, "bfloat16": 2, "float32": 4}.get(file_dtype, 4)
        return -(-num_file_bytes * self.element_size // file_element)
