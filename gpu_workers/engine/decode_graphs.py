"""Captured decode steps: one recorded step (gpu_workers/engine/step_graph.py; CUDA graphs on a GPU) per padded
batch-size bucket, as vLLM does, replayed for every decode step that fits one.

A decode batch of n rows runs in the smallest captured bucket b >= n (1, 2, 4, 8, 16, 24, ... up to
engine_cuda_graph_max_batch_size and engine_max_num_seqs), rows n..b-1 padding (gpu_workers/engine/decode_buffers.py).
Everything that changes from step to step is an input of the recording, copied into static buffers before the
replay: token ids, positions, KV slots, block tables, context lengths and each row's adapter slot
(layers/slot_lora.py). So a new mix of adapters, new ranks or new page tables never capture again. Each bucket
has two recordings: with the LoRA kernels (BGMV over the slot table) and without them (a batch of base-model
rows skips their launches). The recording returns the final hidden states; the LM head, the finite check and
sampling run after the replay on the n real rows (model_runner.py).

What a captured step needs: an attention form that reads the pages in place (IN_PLACE_DECODE_FORMS; on CUDA
"triton", whose launch grid depends only on shapes) and the BGMV kernels (Triton on CUDA). Capture runs at worker
start, largest bucket first (the smaller ones reuse its memory in the shared pool), within a time budget
(engine_cuda_graph_capture_budget_s) and a pool budget (engine_cuda_graph_max_pool_bytes); a bucket left out runs
eagerly. Steps that are not pure decode (prefill chunks, CPU-assisted rows), larger than the largest bucket, or
with an adapter the slot table cannot serve (or a DoRA adapter: the recording has no rescale) run eagerly too; `num_replays` and `num_eager_steps` count both.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from gpu_workers.engine.config import EngineConfig
from gpu_workers.engine.decode_buffers import DecodeBuffers, DecodeRow
from gpu_workers.engine.kernel_plan import KernelPlan
from gpu_workers.engine.layers.attention import IN_PLACE_DECODE_FORMS, AttentionMetadata
from gpu_workers.engine.layers.lora import LoraAdapter, LoraBatch, lora_batch
from gpu_workers.engine.layers.lora_forms import projection_slices
from gpu_workers.engine.layers.rotary import RotaryEmbedding
from gpu_workers.engine.layers.slot_lora import NO_SLOT, AdapterSlots, SlotStep, slot_bounds
from gpu_workers.engine.layers.triton_lora import triton_unusable_reason
from gpu_workers.engine.models.llama import LlamaForCausalLM
from gpu_workers.engine.step_graph import StepFn, StepGraph, StepGraphs
from scheduler.core.sequence import BatchEntry

SLOTS_PER_ROW = (
    2  # adapter slots per row of the largest bucket (a step uses at most one a row; the rest: reuse)
)


def capture_sizes(max_batch_size: int) -> tuple[int, ...]:
    """The buckets: 1, 2, 4, then every multiple of 8, up to max_batch_size, which is always one."""
    sizes = [size for size in (1, 2, 4) if size < max_batch_size]
    sizes += range(8, max_batch_size, 8)
    return (*sizes, max_batch_size) if max_batch_size > 0 else ()


def graphs_unusable_reason(
    config: EngineConfig, device: torch.device, dtype: torch.dtype, plan: KernelPlan, is_device_backend: bool
) -> str | None:
    """Why decode steps are not captured here, or None when they are. `is_device_backend`: graphs come from the
    device's own backend (CUDA); False when a caller supplied one (the CPU tests' eager replay)."""
    if not config.cuda_graphs:
        return "turned off (cuda_graphs=false, LORAHOST_ENGINE_CUDA_GRAPHS)"
    if is_device_backend and device.type != "cuda":
        return f"CUDA graphs need CUDA (this engine runs on {device.type})"
    if plan.decode_attention not in IN_PLACE_DECODE_FORMS:
        return (
            f"a captured step needs a decode attention that reads the pages in place ({', '.join(IN_PLACE_DECODE_FORMS)}); "
            f"the kernel plan chose {plan.decode_attention!r}"
        )
    return _lora_kernels_unusable_reason(device, dtype)


def _lora_kernels_unusable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the BGMV kernels cannot serve a captured step here (on CPU: only under Triton's interpreter, a test
    tool)."""
    if device.type == "cuda":
        return triton_unusable_reason(device, dtype)
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    from gpu_workers.engine.layers import triton_lora_kernels

    if not triton_lora_kernels.IS_INTERPRETED:
        return "on CPU the BGMV kernels run only under Triton's interpreter (TRITON_INTERPRET=1, a test tool)"
    return None


@dataclass(frozen=True)
class CaptureLimits:
    """How much capturing may take at start: the largest bucket, seconds, and pool bytes."""

    max_batch_size: int
    budget_s: float
    max_pool_bytes: int

    @classmethod
    def of(cls, config: EngineConfig) -> CaptureLimits:
        """The config's limits (the largest bucket is at most max_num_seqs)."""
        return cls(
            min(config.cuda_graph_max_batch_size, config.max_num_seqs),
            config.cuda_graph_capture_budget_s,
            config.cuda_graph_max_pool_bytes,
        )


class DecodeGraphs:
    """The captured decode steps of one model runner (module doc)."""

    def __init__(
        self,
        graphs: StepGraphs,
        model: LlamaForCausalLM,
        rotary: RotaryEmbedding,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        decode_form: str,
        buffers: DecodeBuffers,
        slots: AdapterSlots,
    ) -> None:
        self.graphs = graphs
        self.model, self.rotary, self.kv_caches = model, rotary, kv_caches
        self.decode_form = decode_form
        self.buffers, self.slots = buffers, slots
        self.recorded: dict[tuple[int, bool], StepGraph] = {}  # (bucket rows, with LoRA) -> recording
        self.captured_sizes: list[int] = []  # the buckets with at least one recording, ascending
        self.capture_seconds = 0.0
        self.pool_bytes = 0  # the graphs' pool after capture
        self.capture_stopped: str | None = None  # why some buckets were left out
        self.num_replays = 0
        self.num_eager_steps = 0

    @torch.inference_mode()
    def capture(self, sizes: tuple[int, ...], limits: CaptureLimits, clock: Callable[[], float]) -> None:
        """Record each bucket with and without LoRA, largest first, until the time or pool budget is spent."""
        started = clock()
        for size, has_lora in [
            (size, has_lora) for size in sorted(sizes, reverse=True) for has_lora in (True, False)
        ]:
            self.capture_stopped = self._stop_reason(clock() - started, limits)
            if self.capture_stopped is not None:
                break
            self.buffers.fill(size, [])
            graph = self.graphs.new_graph()
            graph.capture(self._step_fn(size, has_lora))
            self.recorded[(size, has_lora)] = graph
        self.captured_sizes = sorted({size for size, _ in self.recorded})
        self.capture_seconds = clock() - started
        self.pool_bytes = self.graphs.pool_bytes()

    def _stop_reason(self, seconds: float, limits: CaptureLimits) -> str | None:
        if seconds > limits.budget_s:
            return f"capture budget of {limits.budget_s:g} s spent"
        if self.graphs.pool_bytes() > limits.max_pool_bytes:
            return f"graph pool reached {limits.max_pool_bytes} bytes"
        return None

    def run(self, entries: list[BatchEntry], adapters: Mapping[str, LoraAdapter]) -> torch.Tensor | None:
        """The final hidden states [len(entries), hidden] of a pure decode step by replay, or None when this step
        runs eagerly (not pure decode: not counted; else counted in num_eager_steps). `adapters`: the device
        adapters (an entry whose adapter is not among them, e.g. CPU-assisted, runs eagerly)."""
        if not all(e.num_new_tokens == 1 and e.is_sampling for e in entries):
            return None
        picked = self._pick(entries, adapters)
        if picked is None:
            self.num_eager_steps += 1
            return None
        graph, size, rows = picked
        self.buffers.fill(size, rows)
        self.num_replays += 1
        return graph.replay()[: len(entries)]

    def forget(self, adapter_id: str) -> None:
        """Free an unloaded adapter's slot."""
        self.slots.forget(adapter_id)

    def _pick(
        self, entries: list[BatchEntry], adapters: Mapping[str, LoraAdapter]
    ) -> tuple[StepGraph, int, list[DecodeRow]] | None:
        """(recording, bucket rows, rows) for this step, or None (no bucket fits, an adapter has no slot)."""
        size = next((s for s in self.captured_sizes if s >= len(entries)), None)
        if size is None:
            return None
        if any(
            e.seq.num_computed_tokens // self.buffers.block_size >= self.buffers.max_blocks for e in entries
        ):
            return None
        adapter_ids = [e.seq.adapter_id for e in entries]
        distinct = list(dict.fromkeys(a for a in adapter_ids if a is not None))
        if any(a not in adapters or not adapters[a].has_projection_deltas_only for a in distinct):
            return None  # a captured step has no DoRA rescale nor embed_tokens / lm_head LoRA (its slot table
            # holds decoder-projection LoRA descriptors only): such steps run eagerly
        slots = self.slots.slots_of([adapters[a] for a in distinct])
        if slots is None:
            return None
        graph = self.recorded.get((size, bool(distinct))) or self.recorded.get((size, True))
        if graph is None:
            return None
        slot_of = dict(zip(distinct, slots))
        rows = [
            DecodeRow(
                e.seq.token_ids[e.seq.num_computed_tokens],
                e.seq.num_computed_tokens,
                e.seq.block_table,
                NO_SLOT if a is None else slot_of[a],
            )
            for e, a in zip(entries, adapter_ids)
        ]
        return graph, size, rows

    def _step_fn(self, size: int, has_lora: bool) -> StepFn:
        """The decode step of a bucket of `size` rows, reading only the static buffers' first `size` rows."""
        buf = self.buffers
        meta = AttentionMetadata(
            slot_mapping=buf.slot_mapping[:size],
            prefills=(),
            decode_token_idx=buf.row_index[:size],
            decode_blocks=buf.block_tables[:size],
            decode_mask=None,
            decode_pad_rows=None,
            is_all_decode=True,
            block_size=buf.block_size,
            decode_lens=buf.seq_lens[:size],
            decode_form=self.decode_form,
        )
        lora = lora_batch(SlotStep(self.slots, buf.row_slot[:size])) if has_lora else LoraBatch()
        input_ids, positions = buf.input_ids[:size], buf.positions[:size]

        def step() -> torch.Tensor:
            cos_sin = self.rotary.lookup(positions)
            return self.model(input_ids, cos_sin, self.kv_caches, meta, lora)  # [size, hidden]

        return step


def build_decode_graphs(
    graphs: StepGraphs,
    config: EngineConfig,
    model: LlamaForCausalLM,
    rotary: RotaryEmbedding,
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    plan: KernelPlan,
    pad_page: int,
    max_model_len: int,
    clock: Callable[[], float] = time.perf_counter,
) -> DecodeGraphs:
    """The runner's captured decode steps, captured now (worker start). `pad_page`: a KV page no sequence owns
    (padding rows write there)."""
    args = model.args
    limits = CaptureLimits.of(config)
    max_blocks = -(-max_model_len // config.block_size)
    device = kv_caches[0][0].device
    buffers = DecodeBuffers(limits.max_batch_size, max_blocks, config.block_size, pad_page, device)
    slices = projection_slices(
        args.hidden_size, args.intermediate_size, args.num_heads, args.num_kv_heads, args.head_dim
    )
    bounds = slot_bounds(slices, config.max_lora_rank)
    slots = AdapterSlots(SLOTS_PER_ROW * limits.max_batch_size, args.num_layers, bounds, device)
    decode_graphs = DecodeGraphs(graphs, model, rotary, kv_caches, plan.decode_attention, buffers, slots)
    decode_graphs.capture(capture_sizes(limits.max_batch_size), limits, clock)
    return decode_graphs
