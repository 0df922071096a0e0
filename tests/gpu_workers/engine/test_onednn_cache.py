"""The bound on torch's oneDNN caches: what it sets, that an operator's own value wins, and (where oneDNN runs
bf16 products) that it bounds the memory a process keeps for the shapes it has seen. Memory is read in fresh
processes: the caches take their capacity at first use and keep it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from gpu_workers.engine.config import EngineConfig
from gpu_workers.engine.onednn_cache import CACHE_CAPACITY_ENV, bound_onednn_caches

# 300 bf16 products of distinct row counts, then the process's RSS growth in MiB (as JSON)
_SHAPES_SCRIPT = """
import json, os, sys
import psutil, torch
if sys.argv[1] != "none":
    from gpu_workers.engine.onednn_cache import bound_onednn_caches
    bound_onednn_caches(int(sys.argv[1]))
torch.set_num_threads(1)
weight = torch.randn(256, 128).to(torch.bfloat16)
process = psutil.Process()
torch.nn.functional.linear(torch.randn(1, 128).to(torch.bfloat16), weight)
before = process.memory_info().rss
for rows in range(2, 302):
    torch.nn.functional.linear(torch.randn(rows, 128).to(torch.bfloat16), weight)
print(json.dumps({"growth_mib": (process.memory_info().rss - before) / 2**20}))
"""


def test_the_bound_sets_both_caches_and_keeps_what_the_operator_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "")  # restored after the test, like the other
    monkeypatch.delenv("LRU_CACHE_CAPACITY")
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "512")
    assert bound_onednn_caches(64) == {"LRU_CACHE_CAPACITY": "64", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "512"}
    assert os.environ["LRU_CACHE_CAPACITY"] == "64"


def test_a_capacity_of_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        bound_onednn_caches(0)


def test_the_engine_config_carries_the_setting_and_refuses_zero(tmp_path: object) -> None:
    assert EngineConfig(model_path=tmp_path).onednn_cache_capacity == 128  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="onednn_cache_capacity must be positive.*ONEDNN_CACHE_CAPACITY"):
        EngineConfig(model_path=tmp_path, onednn_cache_capacity=0)  # type: ignore[arg-type]


def _growth_mib(capacity: str) -> float:
    env = {k: v for k, v in os.environ.items() if k not in CACHE_CAPACITY_ENV}
    done = subprocess.run(
        [sys.executable, "-c", _SHAPES_SCRIPT, capacity],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return float(json.loads(done.stdout.strip().splitlines()[-1])["growth_mib"])


@pytest.mark.skipif(
    not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()),
    reason="oneDNN runs no bf16 products on this CPU (they keep nothing per shape)",
)
def test_the_bound_keeps_the_memory_of_many_product_shapes_small() -> None:
    unbounded, bounded = _growth_mib("none"), _growth_mib("8")
    # each of 300 shapes kept 0.5-0.7 MiB in the two caches without the bound on an Intel Xeon with AMX
    assert unbounded > 30, f"the unbounded caches kept only {unbounded:.0f} MiB for 300 shapes"
    assert bounded < unbounded / 3, (bounded, unbounded)
