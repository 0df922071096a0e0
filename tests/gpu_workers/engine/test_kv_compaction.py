"""Compaction in the engine: a cold adapter's load moves running sequences' KV pages out of its run
(StepPlan.kv_block_moves, ModelRunner.move_kv_blocks); their tokens stay those of a run without it, and the
adapter's tokens are transformers + peft's."""

from __future__ import annotations

from pathlib import Path

from gpu_workers.engine.config import EngineConfig
from gpu_workers.engine.llm_engine import LLMEngine
from scheduler.core.engine_request import EngineRequest
from scheduler.core.sampling import SamplingParams
from tests.gpu_workers.conftest import HfOracle

NUM_PAGES = 16  # one page per running sequence at first: the pool is full
COLD = "adapter-01"  # 4 pages of the tiny model
PARAMS = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


def _prompt(i: int) -> list[int]:
    return [1, *range(20 + 3 * i, 25 + 3 * i)]  # 6 tokens: with 8 outputs, one page of 16 slots


def _run(
    base_model_dir: Path, cold_path: Path, max_compaction_pages: int
) -> tuple[dict[str, list[int]], LLMEngine, int]:
    """16 base requests fill the pool (one page each), the odd ones are aborted (every other page free, no
    two adjacent), then a request of a host-only adapter arrives. -> tokens per surviving request id, the
    engine, and how many tokens the survivors still had to generate when the cold request's first token came."""
    engine = LLMEngine(
        EngineConfig(
            model_path=base_model_dir, dtype="float32", num_kv_blocks=NUM_PAGES, max_num_seqs=NUM_PAGES,
            decode_step="eager", enable_prefix_caching=False, max_compaction_pages=max_compaction_pages,
        )
    )  # fmt: skip
    for i in range(NUM_PAGES):
        engine.add_request(EngineRequest(f"r{i}", tuple(_prompt(i)), PARAMS))
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(0, NUM_PAGES, 2)}
    for out in engine.step():
        tokens.get(out.request_id, []).extend(out.new_token_ids)
    assert [s.block_table for s in engine.scheduler.running] == [[i] for i in range(NUM_PAGES)]
    for i in range(1, NUM_PAGES, 2):
        engine.abort(f"r{i}")
    engine.add_request(EngineRequest("cold", tuple(_prompt(0)), PARAMS, COLD, adapter_path=cold_path))
    tokens["cold"] = []
    num_left_at_cold = -1
    copier = engine.runner.transfers.copier
    while engine.has_unfinished_requests():
        if copier.has_in_flight():  # steps wait for the load's threads, which a busy machine may hold back
            copier.wait_any(timeout=30)
        for out in engine.step():
            if out.request_id in tokens:
                tokens[out.request_id].extend(out.new_token_ids)
            if out.request_id == "cold" and out.new_token_ids and num_left_at_cold < 0:
                num_left_at_cold = sum(PARAMS.max_tokens - len(t) for r, t in tokens.items() if r != "cold")
    return tokens, engine, num_left_at_cold


def test_moved_kv_pages_keep_running_sequences_tokens_and_the_cold_adapter_matches_peft(
    base_model_dir: Path, adapter_dirs: dict[str, Path], hf_oracle: HfOracle
) -> None:
    moved, engine, num_left_moved = _run(base_model_dir, adapter_dirs[COLD], max_compaction_pages=4)
    waited, reference, num_left_waited = _run(base_model_dir, adapter_dirs[COLD], max_compaction_pages=0)
    stats = engine.engine_stats()
    assert (stats.num_compactions, stats.num_kv_block_moves) == (1, 2)  # r12, r14 left the run [12, 16)
    assert reference.counters.num_kv_block_moves == 0
    assert moved == waited
    assert moved["cold"] == hf_oracle.greedy(_prompt(0), COLD, PARAMS.max_tokens)
    assert num_left_moved > 0 and num_left_waited == 0  # compaction let it in while the others ran
