"""Memory geometry: pages of the KV budget and the adapter budget, hand-computed on a small shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scheduler.core.memory_geometry import DEFAULT_NUM_ADAPTERS_ROOM, MemoryGeometry, ModelShape
from scheduler.core.page_pool import num_pages_for_adapter

SHAPE = ModelShape(
    num_layers=2,
    hidden_size=64,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    intermediate_size=176,
    vocab_size=512,
    max_position_embeddings=1024,
)


def test_kv_and_adapter_row_bytes_by_hand() -> None:
    assert SHAPE.kv_bytes_per_token(4) == 2 * 2 * 2 * 16 * 4  # K and V, 2 layers, 2 kv heads, dim 16, fp32
    # per layer: q (64+64) + k, v 2*(64+32) + o (64+64) + gate, up 2*(64+176) + down (176+64)
    assert SHAPE.adapter_row_bytes(2) == 2 * (128 + 192 + 128 + 480 + 240) * 2


def test_static_split_without_adapter_budget_has_room_for_the_default_number_of_max_rank_adapters() -> None:
    g = MemoryGeometry.plan(
        SHAPE, element_size=4, block_size=16, memory_mode="static", kv_cache_bytes=1 << 20, max_lora_rank=8
    )
    page = 512 * 16  # 2 (K, V) x 2 layers x 2 kv heads x 16 dims x 4 bytes per token
    assert g.kv_bytes_per_block == page and g.num_kv_blocks == (1 << 20) // page
    per_adapter = num_pages_for_adapter(8, 8 * SHAPE.adapter_row_bytes(4), page)
    assert g.num_adapter_pages == DEFAULT_NUM_ADAPTERS_ROOM * per_adapter
    assert g.num_pool_pages == g.num_kv_blocks + g.num_adapter_pages
    assert g.max_model_len == 1024  # the context, below the KV capacity


def test_unified_pool_adds_the_adapter_budget_to_the_kv_tensor_and_caps_the_context() -> None:
    g = MemoryGeometry.plan(
        SHAPE,
        element_size=4,
        block_size=16,
        memory_mode="unified",
        kv_cache_bytes=0,
        num_kv_blocks=10,
        adapter_cache_bytes=8192 * 3 + 1,  # 3 pages and a byte: 4 pages
        max_lora_rank=8,
    )
    assert (g.num_kv_blocks, g.num_adapter_pages) == (10 + 4, 0)
    assert g.max_model_len == 14 * 16 and g.is_unified


def test_bad_budgets_and_modes_are_refused() -> None:
    with pytest.raises(ValueError, match="too small for one KV block"):
        MemoryGeometry.plan(
            SHAPE, element_size=4, block_size=16, memory_mode="static", kv_cache_bytes=10, max_lora_rank=8
        )
    with pytest.raises(ValueError, match="memory_mode"):
        MemoryGeometry.plan(
            SHAPE, element_size=4, block_size=16, memory_mode="paged", kv_cache_bytes=1 << 20, max_lora_rank=8
        )


def test_shape_from_a_model_directory_uses_the_engine_defaults(tmp_path: Path) -> None:
    cfg = {
        "num_hidden_layers": 3,
        "hidden_size": 96,
        "num_attention_heads": 6,
        "intermediate_size": 200,
        "vocab_size": 99,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    shape = ModelShape.from_model_dir(tmp_path)
    assert (shape.num_kv_heads, shape.head_dim, shape.max_position_embeddings) == (6, 16, 4096)


def test_adapter_device_bytes_rescale_the_file_dtype() -> None:
    g = MemoryGeometry.plan(
        SHAPE, element_size=2, block_size=16, memory_mode="unified", kv_cache_bytes=1 << 20, max_lora_rank=8
    )
    assert g.adapter_device_bytes(1000, "float32") == 500 and g.adapter_device_bytes(1001, "bfloat16") == 1001
