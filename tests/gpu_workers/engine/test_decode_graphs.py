"""Captured decode steps (gpu_workers/engine/decode_graphs.py): every decode step of a batch of 1..8 rows is replayed
from its padded bucket's recording and equals the same step run eagerly, for adapter mixes never seen at capture
(rows without an adapter, ranks 2..32 mixed), without capturing again; padding rows touch only the padding page;
capture stops at its time and pool budgets; a CPU engine captures nothing and says why.

Where the recordings are CUDA graphs needs a GPU; here (no GPU) the same recorded step functions are replayed
eagerly (step_graph.EagerReplayGraphs: a replay calls the function again on the static buffers, so a step that read
anything but the static buffers would give the capture-time answer), with the BGMV kernels under Triton's
interpreter and the C attention kernel reading the pages in place. On a GPU the same tests run on CUDA graphs
with the Triton attention kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from gpu_workers.engine.config import EngineConfig
from gpu_workers.engine.decode_buffers import DecodeBuffers, DecodeRow
from gpu_workers.engine.decode_graphs import (
    CaptureLimits,
    DecodeGraphs,
    capture_sizes,
    graphs_unusable_reason,
)
from gpu_workers.engine.kernel_plan import KernelPlan
from gpu_workers.engine.layers.attention import is_decode_form_usable
from gpu_workers.engine.layers.lora import LoraAdapter, build_lora_projection
from gpu_workers.engine.layers.lora_descriptors import adapter_descriptors
from gpu_workers.engine.layers.slot_lora import AdapterSlots, slot_bounds
from gpu_workers.engine.llm_engine import LLMEngine
from gpu_workers.engine.model_runner import ModelRunner
from gpu_workers.engine.step_graph import (
    CudaStepGraphs,
    EagerReplayGraphs,
    StepFn,
    StepGraph,
    StepGraphs,
)
from scheduler.core.engine_request import EngineRequest
from scheduler.core.sampling import SamplingParams
from scheduler.core.sequence import BatchEntry
from tests.gpu_workers.engine.triton_interpreter import KERNEL_DEVICE, needs_triton_kernels

CPU = torch.device("cpu")
MAX_BATCH = 8


class CountingGraphs:
    """A StepGraphs that counts the recordings made."""

    def __init__(self, inner: StepGraphs) -> None:
        self.inner = inner
        self.num_recorded = 0

    def new_graph(self) -> StepGraph:
        self.num_recorded += 1
        return self.inner.new_graph()

    def pool_bytes(self) -> int:
        return self.inner.pool_bytes()


def test_batch_sizes_are_padded_to_vllms_buckets() -> None:
    assert capture_sizes(64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert capture_sizes(10) == (1, 2, 4, 8, 10)
    assert capture_sizes(3) == (1, 2, 3)
    assert capture_sizes(1) == (1,)


@pytest.fixture(scope="module")
def graph_engine(
    base_model_dir: Path, adapter_dirs: dict[str, Path]
) -> Iterator[tuple[LLMEngine, CountingGraphs]]:
    """An engine whose decode steps are replayed (CUDA graphs on a GPU, eager replay on CPU) and its graphs."""
    if KERNEL_DEVICE is None:
        pytest.skip("the BGMV kernels need a GPU or Triton's interpreter")
    device = KERNEL_DEVICE
    attention = "triton" if device.type == "cuda" else "c_kernel"
    if not is_decode_form_usable(attention, device, torch.float32):
        pytest.skip(f"the {attention} decode attention cannot run here")
    config = EngineConfig(
        model_path=base_model_dir,
        device=device.type,
        dtype="float32",
        num_kv_blocks=256,
        max_num_seqs=MAX_BATCH,
        max_lora_rank=32,
        decode_attention=attention,
        decode_step="eager",
    )
    inner: StepGraphs = CudaStepGraphs(device) if device.type == "cuda" else EagerReplayGraphs(device)
    counting = CountingGraphs(inner)
    engine = LLMEngine(config, executor=ModelRunner(config, step_graphs=lambda _: counting))
    for name, path in adapter_dirs.items():
        engine.load_adapter(name, path)
    yield engine, counting


def _drain(engine: LLMEngine) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return tokens


@needs_triton_kernels
def test_replayed_decode_steps_equal_eager_steps_for_any_batch_size_and_adapter_mix(
    graph_engine: tuple[LLMEngine, CountingGraphs],
    hf_oracle: Any,
    prompt_ids: list[list[int]],
    adapter_dirs: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two rounds of 8 requests finishing one after another (decode batches of 8, 7, ..., 1 rows in buckets 8, 8,
    8, 8, 4, 4, 2, 1), each round a different mix of the 5 adapters (ranks 2..32, different target modules) and
    rows without one: every decode step is a replay whose logits equal the same step run eagerly just before it,
    the tokens are peft's, and nothing is captured again."""
    engine, counting = graph_engine
    runner = engine.runner
    graphs = runner.decode_graphs
    assert graphs is not None and graphs.captured_sizes == [1, 2, 4, 8]
    num_recorded = counting.num_recorded
    assert num_recorded == 2 * len(graphs.captured_sizes)  # with and without LoRA
    replay = graphs.run
    steps: list[tuple[int, tuple[str | None, ...]]] = []

    def replay_beside_eager(entries: list[BatchEntry], adapters: Any) -> torch.Tensor | None:
        if any(e.num_new_tokens > 1 for e in entries):
            return replay(entries, adapters)  # a prefill step: eager (not counted)
        eager = runner.model.logits(runner.forward(entries))
        hidden = replay(entries, adapters)
        assert hidden is not None, "a decode step of at most 8 rows must be replayed"
        torch.testing.assert_close(runner.model.logits(hidden), eager, rtol=1e-4, atol=1e-4)
        steps.append((len(entries), tuple(e.seq.adapter_id for e in entries)))
        return hidden

    monkeypatch.setattr(graphs, "run", replay_beside_eager)
    names = list(adapter_dirs)
    mixes = [
        [names[0], None, names[1], names[2], names[0], names[3], names[4], None],
        [None, names[4], names[3], names[3], names[2], None, names[1], names[0]],
    ]
    for round_, mix in enumerate(mixes):
        prompts = [prompt_ids[(i + round_) % len(prompt_ids)] for i in range(MAX_BATCH)]
        for i, (prompt, adapter) in enumerate(zip(prompts, mix)):
            params = SamplingParams(max_tokens=2 + i, temperature=0, ignore_eos=True)
            engine.add_request(EngineRequest(f"r{round_}-{i}", tuple(prompt), params, adapter))
        tokens = _drain(engine)
        for i, (prompt, adapter) in enumerate(zip(prompts, mix)):
            assert tokens[f"r{round_}-{i}"] == hf_oracle.greedy(prompt, adapter, 2 + i), (round_, i, adapter)

    assert {size for size, _ in steps} == set(range(1, MAX_BATCH + 1))
    assert len({mix for _, mix in steps}) == len(steps)  # every step a mix of its own
    stats = engine.runner_stats()
    assert stats.num_graph_replays >= len(steps) and stats.num_eager_decode_steps == 0
    assert stats.captured_batch_sizes == [1, 2, 4, 8] and stats.graphs_off_reason is None
    assert counting.num_recorded == num_recorded  # new mixes changed the buffers, never the recordings
    assert graphs.slots.num_writes == len(names)  # each adapter's descriptors copied once


def test_padding_rows_write_only_the_padding_page_and_carry_no_adapter() -> None:
    buffers = DecodeBuffers(max_rows=4, max_blocks=3, block_size=4, pad_page=9, device=CPU)
    buffers.fill(4, [DecodeRow(token_id=11, position=5, block_table=[2, 7, 1], slot=3)])
    assert buffers.input_ids.tolist() == [11, 0, 0, 0]
    assert buffers.positions.tolist() == [5, 0, 0, 0]
    assert buffers.slot_mapping.tolist() == [7 * 4 + 1, 36, 36, 36]  # padding: the padding page's first slot
    assert buffers.seq_lens.tolist() == [6, 1, 1, 1]
    assert buffers.row_slot.tolist() == [3, -1, -1, -1]
    assert buffers.block_tables[0, :2].tolist() == [2, 7] and buffers.block_tables[1:, 0].tolist() == [
        9,
        9,
        9,
    ]
    buffers.fill(2, [])  # a later, smaller step: its rows are all padding again
    assert buffers.slot_mapping[:2].tolist() == [36, 36] and buffers.row_slot[:2].tolist() == [-1, -1]
    assert buffers.block_tables[0, 0].item() == 9
    with pytest.raises(ValueError, match="rows in a bucket"):
        buffers.fill(1, [DecodeRow(1, 0, [0]), DecodeRow(2, 0, [1])])


def _adapter(name: str, rank: int) -> LoraAdapter:
    generator = torch.Generator().manual_seed(rank)
    a, b = torch.randn(rank, 8, generator=generator), torch.randn(6, rank, generator=generator)
    projection = build_lora_projection({"o_proj": (a, b)}, "o", {"o_proj": (0, 6)}, 1.0, torch.float32, CPU)
    assert projection is not None
    return LoraAdapter(name, rank, 1.0, ("o_proj",), ({"o": projection},), 0)


def _descriptors(adapter: LoraAdapter) -> torch.Tensor:
    desc = adapter_descriptors(adapter)
    assert desc is not None
    return desc


def test_adapter_slots_are_written_once_reused_least_recently_used_and_freed_on_unload() -> None:
    bounds = slot_bounds({"o": (8, {"o_proj": (0, 6)})}, max_lora_rank=8)
    slots = AdapterSlots(num_slots=2, num_layers=1, bounds=bounds, device=CPU)
    a, b, c = _adapter("a", 2), _adapter("b", 4), _adapter("c", 8)
    assert slots.slots_of([a, b]) == [0, 1]
    assert torch.equal(slots.desc[0], _descriptors(a)) and torch.equal(slots.desc[1], _descriptors(b))
    assert slots.slots_of([b]) == [1] and slots.num_writes == 2  # already there: nothing copied
    assert slots.slots_of([c, b]) == [0, 1]  # c takes the least recently used slot a step does not use
    assert torch.equal(slots.desc[0], _descriptors(c))
    assert slots.slots_of([a, b, c]) is None  # more adapters than slots: that step runs eagerly
    assert slots.slots_of([_adapter("big", 16)]) is None  # above the rank the grids were sized for
    slots.forget("b")
    assert not slots.desc[1].any() and slots.slots_of([a]) == [1]


class _FakeGraphs:
    """Recordings that record nothing (the capture loop's budgets only); each takes `bytes_each` of pool."""

    def __init__(self, bytes_each: int) -> None:
        self.bytes_each, self.num_graphs = bytes_each, 0

    def new_graph(self) -> _FakeGraph:
        self.num_graphs += 1
        return _FakeGraph()

    def pool_bytes(self) -> int:
        return self.num_graphs * self.bytes_each


class _FakeGraph:
    def capture(self, fn: StepFn) -> torch.Tensor:
        return torch.empty(0)

    def replay(self) -> torch.Tensor:
        return torch.empty(0)


def _fake_decode_graphs(runner: ModelRunner, graphs: _FakeGraphs) -> DecodeGraphs:
    buffers = DecodeBuffers(MAX_BATCH, 4, runner.block_size, pad_page=0, device=CPU)
    slots = AdapterSlots(2, runner.args.num_layers, {}, CPU)
    return DecodeGraphs(graphs, runner.model, runner.rotary, runner.kv_caches, "c_kernel", buffers, slots)


@pytest.mark.parametrize(
    ("budget_s", "max_pool_bytes", "recorded", "why"),
    [
        (1.0, 10_000, [(8, True)], "capture budget of 1 s spent"),
        (100.0, 150, [(8, True), (8, False)], "graph pool"),
    ],
)
def test_capture_stops_at_its_time_and_pool_budgets_largest_bucket_first(
    fp32_engine: LLMEngine,
    budget_s: float,
    max_pool_bytes: int,
    recorded: list[tuple[int, bool]],
    why: str,
) -> None:
    ticks = iter(range(100))
    clock: Callable[[], float] = lambda: 0.6 * next(ticks)
    decode_graphs = _fake_decode_graphs(fp32_engine.runner, _FakeGraphs(bytes_each=100))
    decode_graphs.capture(capture_sizes(MAX_BATCH), CaptureLimits(MAX_BATCH, budget_s, max_pool_bytes), clock)
    assert list(decode_graphs.recorded) == recorded and decode_graphs.captured_sizes == [8]
    assert decode_graphs.capture_stopped is not None and why in decode_graphs.capture_stopped


def test_a_cpu_engine_captures_nothing_keeps_its_pool_and_says_why(fp32_engine: LLMEngine) -> None:
    runner = fp32_engine.runner
    assert runner.decode_graphs is None and runner.graphs_off_reason is not None
    assert "CUDA graphs need CUDA" in runner.graphs_off_reason
    assert runner.kv_caches[0][0].shape[0] == runner.num_kv_blocks * runner.block_size  # no padding page
    stats = fp32_engine.runner_stats()
    assert stats.graphs_off_reason == runner.graphs_off_reason
    assert (stats.captured_batch_sizes, stats.num_graph_replays, stats.graph_pool_bytes) == ([], 0, 0)


def test_why_decode_steps_are_not_captured(base_model_dir: Path) -> None:
    plan = KernelPlan(prefill_gemm="plain", decode_attention="triton", decode_lora="bgmv")
    config = EngineConfig(model_path=base_model_dir, cuda_graphs=False)
    assert "LORAHOST_ENGINE_CUDA_GRAPHS" in str(
        graphs_unusable_reason(config, CPU, torch.float32, plan, True)
    )
    config = EngineConfig(model_path=base_model_dir)
    assert "need CUDA" in str(graphs_unusable_reason(config, CPU, torch.float32, plan, True))
    gathering = KernelPlan(prefill_gemm="plain", decode_attention="sdpa", decode_lora="bgmv")
    assert "in place" in str(graphs_unusable_reason(config, CPU, torch.float32, gathering, False))


@needs_triton_kernels
@pytest.mark.parametrize(
    ("kind", "modules", "use_dora"),
    [("dora", ("q_proj", "down_proj"), True), ("vocab", ("q_proj", "embed_tokens", "lm_head"), False)],
)
def test_a_decode_step_with_a_dora_or_vocab_lora_row_runs_eagerly_and_gives_peft_tokens(
    graph_engine: tuple[LLMEngine, CountingGraphs],
    base_model_dir: Path,
    adapter_dirs: dict[str, Path],
    prompt_ids: list[list[int]],
    tmp_path: Path,
    kind: str,
    modules: tuple[str, ...],
    use_dora: bool,
) -> None:
    """A captured step has no DoRA rescale nor LoRA on embed_tokens / lm_head (its slot table holds decoder
    LoRA descriptors only): a decode batch with such a row is not replayed but run eagerly, and its tokens are
    peft's."""
    from gpu_workers.engine.demo_model import generate_adapter
    from tests.gpu_workers.conftest import HfOracle

    engine, _ = graph_engine
    path = generate_adapter(base_model_dir, tmp_path / kind, 4, modules, seed=9, use_dora=use_dora)
    engine.load_adapter(kind, path)
    name = next(iter(adapter_dirs))
    oracle = HfOracle(base_model_dir, {name: adapter_dirs[name], kind: path}, torch.float32)
    before = engine.runner_stats().num_eager_decode_steps
    rows: list[str | None] = [kind, name, None]
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    for i, adapter in enumerate(rows):
        engine.add_request(EngineRequest(f"{kind}-{i}", tuple(prompt_ids[i]), params, adapter))
    tokens = _drain(engine)
    for i, adapter in enumerate(rows):
        assert tokens[f"{kind}-{i}"] == oracle.greedy(prompt_ids[i], adapter, 3), adapter
    assert engine.runner_stats().num_eager_decode_steps >= before + 2
