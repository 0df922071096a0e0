"""The twin profiler's host-assisted prefill steps (gpu_workers/engine/host_prefill_timer.py): each timed step
is a cold adapter's prefill computed on the host copy, whatever the machine copies; the engine is left as it
was (link, layer switch, no extra adapters)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gpu_workers.engine.host_prefill_timer import time_host_prefills
from gpu_workers.engine.llm_engine import LLMEngine
from gpu_workers.engine.profile_grid import ProfileGrid
from gpu_workers.engine.profiler import write_adapters


def test_each_sample_is_one_host_assisted_prefill_and_the_engine_is_restored(
    make_engine: Callable[..., LLMEngine], base_model_dir: Path, tmp_path: Path
) -> None:
    grid = ProfileGrid(ranks=(4, 16), batch_sizes=(1,), prompt_tokens=(8, 24), num_repeats=2)
    adapter_dirs = write_adapters(base_model_dir, grid.ranks, tmp_path)
    engine = make_engine()
    adapters_before = engine.loaded_adapters()
    steps = time_host_prefills(engine, grid, adapter_dirs)
    got = sorted(step.shape.host_token_ranks for step in steps)
    want = sorted(((tokens, rank),) for rank in (4, 16) for tokens in (8, 24) for _ in range(2))
    assert got == want
    assert all(step.shape.lora_token_ranks == () and step.seconds > 0 for step in steps)
    assert engine.runner.transfers.copier.link_gbps is None and engine.runner.host_switch_layer is None
    assert engine.loaded_adapters() == adapters_before and not engine.has_unfinished_requests()
    assert engine.engine_stats().num_cpu_assisted_prefills == len(steps)
