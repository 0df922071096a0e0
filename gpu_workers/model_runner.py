"""The model runner owns every tensor: weights, paged KV cache, device copies of adapters; it turns a
scheduled batch into tensors, runs the model and samples. Which adapters are on the device is decided by
the engine core (scheduler/core/); the engine changes `adapters` only when it carries out a step plan."""

from __future__ import annotations

from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from gpu_workers.adapter_copier import AdapterCopier
from gpu_workers.config import DEFAULT_NUM_ADAPTERS_ROOM, EngineConfig
from gpu_workers.host_malloc import keep_large_allocations_on_heap
from gpu_workers.kernel_plan import KernelPlan, plan_kernels, uses_packed_linears
from gpu_workers.kernel_tuner import KernelTuner
from gpu_workers.layers import cpu_kernels
from gpu_workers.layers.attention import AttentionMetadata, PrefillChunk
from gpu_workers.layers.host_lora import HostLora, LayerSwitch
from gpu_workers.layers.lora import LoraAdapter, LoraBatch, LoraSegment, lora_batch, segmented_step
from gpu_workers.layers.lora_kernel import (
    MAX_KERNEL_SEGMENT_TOKENS,
    KernelLora,
    KernelStep,
    adapter_descriptors,
    build_kernel_lora,
)
from gpu_workers.layers.rotary import RotaryEmbedding
from gpu_workers.layers.stacked_lora import StackedLora, StackedStep, build_stacked_lora, stacked_masks
from gpu_workers.layers.sampler import sample_tokens
from gpu_workers.loader import iter_safetensors, read_hf_config, safetensors_files
from gpu_workers.models.llama import LlamaForCausalLM, ModelArgs
from gpu_workers.runner_adapters import AdapterTransfers
from registry.validation import AdapterInfo, BaseModelSpec, ValidationLimits
from scheduler.core.host_tier import HostTier
from scheduler.core.page_pool import num_pages_for_adapter
from scheduler.core.sequence import BatchEntry, Sequence

# Cost model for choosing the LoRA form of a step (CPU-tuned, rough): a matmul-sized op costs ~20 us of
# fixed overhead; the stacked form multiplies every token by every adapter of the batch (wasted flops).
_OP_SECONDS = 20e-6
_FLOPS_PER_SECOND = 2.5e11


@dataclass(frozen=True)
class StepInputs:
    """Tensors and metadata for one forward pass."""

    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    attention: AttentionMetadata
    lora: LoraBatch
    sample_rows: torch.Tensor  # [num_sampling] batch rows whose logits are sampled


class ModelRunner(AdapterTransfers):
    """Weights + KV cache + adapters on one device; `execute` runs one scheduled batch. Adapter loading,
    placement and host -> device copies are in `AdapterTransfers` (gpu_workers/runner_adapters.py)."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = config.resolved_device()
        self.dtype = config.resolved_dtype()
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        if self.device.type == "cpu" and config.tune_host_malloc:
            keep_large_allocations_on_heap()
        hf_config = read_hf_config(config.model_path)
        self.args = ModelArgs.from_hf_config(hf_config)
        self.model_spec = BaseModelSpec.from_hf_config(hf_config)
        self.validation_limits = ValidationLimits(max_rank=config.max_lora_rank)
        self.use_packed_linears = uses_packed_linears(config, self.dtype, self.device)
        # CPU kernels chosen by measurement on this machine and the model's shapes (cached, gpu_workers/kernel_plan.py)
        self.kernel_tuner = KernelTuner(config.kernel_choices_path)
        self.kernel_plan: KernelPlan = plan_kernels(
            self.kernel_tuner, config, self.args, self.dtype, self.device, self.use_packed_linears
        )
        self.wide_gemm_dtype = self.kernel_plan.wide_gemm_dtype if self.use_packed_linears else None
        self.model = self._load_model()
        self.block_size = config.block_size
        self.num_kv_blocks = self._num_kv_blocks()
        self.max_model_len = min(
            config.max_model_len or self.args.max_position_embeddings, self.num_kv_blocks * self.block_size
        )
        self.rotary = RotaryEmbedding(
            self.args.head_dim, max(self.max_model_len, 1), self.args.rope, self.dtype, self.device
        )
        self.kv_caches = self._allocate_kv_cache()
        self.adapters: dict[str, LoraAdapter] = {}
        # Stacked adapter sets for decode-sized steps, LRU, keyed by the ordered adapter objects' ids
        # (an entry holds its adapters, so a reloaded adapter gets a new key).
        self.lora_stacks: OrderedDict[tuple[int, ...], StackedLora] = OrderedDict()
        self.num_lora_stack_builds = 0
        # CPU kernel for decode-sized LoRA segments (layers/lora_kernel.py) where the plan chose it: built (or
        # loaded from the cache, layers/cpu_kernels.py) by then, so no request waits for it; descriptor sets
        # cached per adapter set.
        self.use_lora_kernel = self.kernel_plan.decode_lora == "kernel"
        self.cpu_kernels_compile_s = cpu_kernels.compile_seconds  # None: loaded from the cache (or none)
        self.kernel_sets: OrderedDict[tuple[int, ...], KernelLora] = OrderedDict()
        self._kernel_descriptors: dict[int, tuple[LoraAdapter, torch.Tensor | None]] = {}
        self._adapter_cost: dict[int, tuple[int, int]] = {}  # id(adapter) -> (ops per step, elements)
        # CPU-assisted prefill: host copies of the adapters being copied, the copy link and the CPU pool.
        self.copier = AdapterCopier(self.device, config.adapter_link_gbps)
        self.host_copies: dict[str, LoraAdapter] = {}  # adapters whose copy to the device is in flight
        self.host_tier = HostTier(config.host_adapter_cache_bytes)  # packed host copies kept for later copies
        self._host_tier_copies: dict[str, LoraAdapter] = {}
        self._cpu_pool: ThreadPoolExecutor | None = None
        self.host_switch_layer: int | None = None  # test hook, see layers/host_lora.LayerSwitch
        self.last_switched_at: dict[str, int] = {}  # last host-assisted step: adapter -> first device layer
        self.generators: dict[str, torch.Generator] = {}
        self.default_generator = torch.Generator(device=self.device).manual_seed(config.seed)

    # ---- setup -------------------------------------------------------------------------------------

    def _load_model(self) -> LlamaForCausalLM:
        model = LlamaForCausalLM(self.args, self.dtype, self.device)
        model.load_weights(iter_safetensors(safetensors_files(self.config.model_path)))
        if self.use_packed_linears:
            model.pack_linears(self.wide_gemm_dtype)
        return model.eval()

    def kv_bytes_per_block(self) -> int:
        """Bytes of K and V for one block across all layers."""
        elem = self._element_size()
        return 2 * self.args.num_layers * self.config.block_size * self.args.num_kv_heads * self.args.head_dim * elem

    @property
    def is_unified(self) -> bool:
        """True when adapters live in the KV cache's pages (memory_mode "unified")."""
        return self.config.memory_mode == "unified"

    @property
    def page_numel(self) -> int:
        """Elements of K (or of V) one page holds in one layer."""
        return self.config.block_size * self.args.num_kv_heads * self.args.head_dim

    def _num_kv_blocks(self) -> int:
        """Pages of the KV tensor: the KV budget, plus the adapter budget in a unified pool."""
        if self.config.num_kv_blocks is not None:
            num_blocks = self.config.num_kv_blocks
        else:
            num_blocks = self.config.kv_cache_bytes // self.kv_bytes_per_block()
            if num_blocks < 1:
                raise ValueError("kv_cache_bytes is too small for one KV block; raise it or set num_kv_blocks")
        if self.is_unified and self.config.adapter_cache_bytes is not None:
            num_blocks += -(-self.config.adapter_cache_bytes // self.kv_bytes_per_block())
        return int(num_blocks)

    def adapter_row_bytes(self) -> int:
        """Device bytes of one rank row of an adapter that targets every projection of every layer."""
        a = self.args
        q_out, kv_out = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
        h, i = a.hidden_size, a.intermediate_size
        per_layer = (h + q_out) + 2 * (h + kv_out) + (q_out + h) + 2 * (h + i) + (i + h)  # q, k, v, o, gate, up, down
        return a.num_layers * per_layer * self._element_size()

    def num_adapter_pages(self) -> int:
        """Pool pages only adapters use (static split): adapter_cache_bytes, or room for
        DEFAULT_NUM_ADAPTERS_ROOM adapters of max_lora_rank; 0 in a unified pool (adapters take KV pages)."""
        if self.is_unified:
            return 0
        page_bytes = self.kv_bytes_per_block()
        if self.config.adapter_cache_bytes is not None:
            return -(-self.config.adapter_cache_bytes // page_bytes)
        max_rank = self.config.max_lora_rank
        pages_per_adapter = num_pages_for_adapter(max_rank, max_rank * self.adapter_row_bytes(), page_bytes)
        return DEFAULT_NUM_ADAPTERS_ROOM * pages_per_adapter

    def adapter_device_bytes(self, info: AdapterInfo) -> int:
        """Device bytes an adapter will take (its weight file's bytes rescaled to the engine dtype)."""
        file_element = {"float16": 2, "bfloat16": 2, "float32": 4}.get(info.dtype, 4)
        return -(-info.num_bytes * self._element_size() // file_element)

    def _element_size(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    def _allocate_kv_cache(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        # Per layer: [num_blocks * block_size, num_kv_heads, head_dim] (flat slot view of the page pool).
        shape = (self.num_kv_blocks * self.block_size, self.args.num_kv_heads, self.args.head_dim)
        return [
            (torch.zeros(shape, dtype=self.dtype, device=self.device),
             torch.zeros(shape, dtype=self.dtype, device=self.device))
            for _ in range(self.args.num_layers)
        ]

    # ---- one step ----------------------------------------------------------------------------------

    @torch.inference_mode()
    def execute(
        self,
        entries: list[BatchEntry],
        return_logits: bool = False,
        host_assisted: frozenset[str] | set[str] = frozenset(),
    ) -> tuple[list[int | None], torch.Tensor | None]:
        """Run one batch (entries sorted by adapter) -> sampled token per sampling entry (+ their logits).

        Entries of a `host_assisted` adapter (still being copied; prefills only) get their LoRA delta from
        the adapter's host copy on the CPU pool until its device copy lands (then from the next layer on).
        A row whose logits are not all finite (an adapter whose weights overflow) gets None instead of a
        token and is not sampled, so it cannot fail its batch neighbours' sampling.
        """
        inputs = self.prepare(entries, frozenset(host_assisted))
        cos_sin = self.rotary.lookup(inputs.positions)
        hidden = self.model(
            inputs.input_ids, cos_sin, self.kv_caches, inputs.attention, inputs.lora, output_rows=inputs.sample_rows
        )  # [num_sampling, hidden]
        host = inputs.lora.find(HostLora)
        if host is not None:
            switched_at = host.switch.switched_at
            self.last_switched_at = {a: switched_at.get(a, self.args.num_layers) for a in host_assisted}
        sampling = [e for e in entries if e.is_sampling]
        if not sampling:
            return [], None
        logits = self.model.logits(hidden)  # [num_sampling, vocab]
        # one check for all sampled rows: x * 0 is 0 for finite x and NaN for inf / NaN (a sum cannot overflow)
        is_finite = torch.isfinite(logits.mul(0.0).sum(dim=-1)).tolist()
        tokens = self._sample(logits, sampling, is_finite)
        return tokens, (logits if return_logits else None)

    def _sample(self, logits: torch.Tensor, sampling: list[BatchEntry], is_finite: list[bool]) -> list[int | None]:
        """Sample the rows with finite logits; None for the others."""
        rows = [i for i, ok in enumerate(is_finite) if ok]
        if len(rows) < len(sampling):
            logits = logits[rows]
        params = [sampling[i].seq.sampling_params for i in rows]
        generators = [self._generator_for(sampling[i].seq) for i in rows]
        sampled = iter(sample_tokens(logits, params, generators) if rows else [])
        return [next(sampled) if ok else None for ok in is_finite]

    def _generator_for(self, seq: Sequence) -> torch.Generator | None:
        if seq.sampling_params.is_greedy:
            return None
        if seq.sampling_params.seed is None:
            return self.default_generator
        gen = self.generators.get(seq.request_id)
        if gen is None:
            gen = torch.Generator(device=self.device).manual_seed(seq.sampling_params.seed)
            self.generators[seq.request_id] = gen
        return gen

    def release_request(self, request_id: str) -> None:
        """Drop per-request sampler state."""
        self.generators.pop(request_id, None)

    def prepare(self, entries: list[BatchEntry], host_assisted: frozenset[str] = frozenset()) -> StepInputs:
        """Build token ids, positions, slot mappings, attention and LoRA segment metadata for one step."""
        bs = self.block_size
        ids: list[int] = []
        positions: list[torch.Tensor] = []
        slots: list[torch.Tensor] = []
        prefills: list[PrefillChunk] = []
        decode_rows: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        sample_rows: list[int] = []
        for entry in entries:
            seq, start = entry.seq, entry.seq.num_computed_tokens
            end, row = start + entry.num_new_tokens, len(ids)
            ids.extend(seq.token_ids[start:end])
            table = torch.tensor(seq.block_table, dtype=torch.long)
            context_pos = torch.arange(end)
            context_slots = table[context_pos // bs] * bs + context_pos % bs  # [end]
            positions.append(context_pos[start:])
            slots.append(context_slots[start:])
            if entry.num_new_tokens == 1:
                decode_rows.append(row)
                decode_tables.append(seq.block_table)
                decode_lens.append(end)
            else:
                prefills.append(self._prefill_chunk(row, start, end, context_slots))
            if entry.is_sampling:
                sample_rows.append(row + entry.num_new_tokens - 1)
        prefills = _batch_equal_prefills(prefills)
        attention = self._attention_metadata(torch.cat(slots), prefills, decode_rows, decode_tables, decode_lens, len(ids))
        return StepInputs(
            input_ids=torch.tensor(ids, dtype=torch.long, device=self.device),
            positions=torch.cat(positions).to(self.device),
            attention=attention,
            lora=self._lora_batch(entries, host_assisted),
            sample_rows=torch.tensor(sample_rows, dtype=torch.long, device=self.device),
        )

    def _prefill_chunk(self, row: int, start: int, end: int, context_slots: torch.Tensor) -> PrefillChunk:
        num_new = end - start
        if start == 0:
            return PrefillChunk(start=row, end=row + num_new, context_slots=None, mask=None)
        q_pos = torch.arange(start, end).unsqueeze(1)  # [num_new, 1]
        mask = torch.arange(end).unsqueeze(0) <= q_pos  # [num_new, end]
        return PrefillChunk(row, row + num_new, context_slots.to(self.device), mask.to(self.device))

    def _attention_metadata(
        self,
        slot_mapping: torch.Tensor,
        prefills: list[PrefillChunk],
        decode_rows: list[int],
        decode_tables: list[list[int]],
        decode_lens: list[int],
        num_tokens: int,
    ) -> AttentionMetadata:
        if not decode_rows:
            return AttentionMetadata(
                slot_mapping.to(self.device), tuple(prefills), None, None, None, None, False, self.block_size
            )
        bs = self.block_size
        max_len = max(decode_lens)
        max_blocks = -(-max_len // bs)
        tables = torch.zeros(len(decode_rows), max_blocks, dtype=torch.long)  # pad with block 0 (masked)
        for i, table in enumerate(decode_tables):
            n = min(len(table), max_blocks)
            tables[i, :n] = torch.tensor(table[:n], dtype=torch.long)
        lens = torch.tensor(decode_lens, dtype=torch.long)
        form = self.kernel_plan.decode_attention
        if form == "c_kernel":  # reads positions < lens in place: no padding to mask
            pad_rows = is_real = torch.empty(0, dtype=torch.long)
        else:
            pos = torch.arange(max_blocks * bs)
            is_real = pos.unsqueeze(0) < lens.unsqueeze(1)  # [num_decodes, max_blocks * bs]
            pad_rows = (~is_real).view(-1).nonzero().squeeze(1)  # rows of the gathered [num_decodes * max_context] K
        return AttentionMetadata(
            slot_mapping=slot_mapping.to(self.device),
            prefills=tuple(prefills),
            decode_token_idx=torch.tensor(decode_rows, dtype=torch.long, device=self.device),
            decode_blocks=tables.to(self.device),
            decode_mask=is_real[:, None, None, :].to(self.device) if pad_rows.numel() else None,
            decode_pad_rows=pad_rows.to(self.device) if pad_rows.numel() else None,
            is_all_decode=len(decode_rows) == num_tokens,
            block_size=bs,
            decode_lens=lens.to(self.device),
            decode_form=form,
        )

    def forget_adapter(self, adapter_id: str) -> None:
        """Drop cached stacked sets that include an adapter (call when it is unloaded or replaced)."""
        for key in [k for k, v in self.lora_stacks.items() if any(a.adapter_id == adapter_id for a in v.adapters)]:
            del self.lora_stacks[key]
        for key in [k for k, v in self.kernel_sets.items() if any(a.adapter_id == adapter_id for a in v.adapters)]:
            del self.kernel_sets[key]
        for key in [k for k, (a, _) in self._kernel_descriptors.items() if a.adapter_id == adapter_id]:
            del self._kernel_descriptors[key]
        # Costs are keyed by id(adapter), which a later adapter object may reuse once this one is freed.
        self._adapter_cost.clear()

    def lora_stack_bytes(self) -> int:
        """Bytes held by the cached stacked adapter sets."""
        return sum(v.num_bytes for v in self.lora_stacks.values())

    def _cost_of(self, adapter: LoraAdapter) -> tuple[int, int]:
        """(matmul ops per step in the segment form, weight elements) of one adapter."""
        cost = self._adapter_cost.get(id(adapter))
        if cost is None:
            ops = sum(1 + len(p.parts) for layer in adapter.layers for p in layer.values())
            elems = sum(
                p.a_t.numel() + sum(b.numel() for *_, b in p.parts) for layer in adapter.layers for p in layer.values()
            )
            cost = (ops, elems)
            if len(self._adapter_cost) > 4 * max(len(self.adapters), 64):
                self._adapter_cost.clear()
            self._adapter_cost[id(adapter)] = cost
        return cost

    def _use_stacked(self, segments: list[LoraSegment], num_tokens: int) -> bool:
        """Stacked when its wasted flops cost less than the segment loop's per-op overhead."""
        if len(segments) < 2 or self.config.lora_stack_cache_size <= 0:
            return False
        seg_ops = seg_elems = total_elems = max_ops = 0
        for seg in segments:
            ops, elems = self._cost_of(seg.adapter)
            seg_ops += ops
            seg_elems += elems * (seg.end - seg.start)
            total_elems += elems
            max_ops = max(max_ops, ops)
        segment_cost = seg_ops * _OP_SECONDS + 2 * seg_elems / _FLOPS_PER_SECOND
        # stacked: about the ops of the largest adapter + one masked fill per (layer, projection)
        stacked_ops = max_ops + sum(len(layer) for layer in segments[0].adapter.layers)
        stacked_cost = stacked_ops * _OP_SECONDS + 2 * num_tokens * total_elems / _FLOPS_PER_SECOND
        return stacked_cost < segment_cost

    def _stacked_lora(self, adapters: tuple[LoraAdapter, ...]) -> StackedLora:
        key = tuple(id(a) for a in adapters)
        stacked = self.lora_stacks.get(key)
        if stacked is not None:
            self.lora_stacks.move_to_end(key)
            return stacked
        stacked = build_stacked_lora(adapters, pack=self.use_packed_linears)
        self.num_lora_stack_builds += 1
        self.lora_stacks[key] = stacked
        while len(self.lora_stacks) > self.config.lora_stack_cache_size:
            self.lora_stacks.popitem(last=False)
        return stacked

    def _lora_batch(self, entries: list[BatchEntry], host_assisted: frozenset[str] = frozenset()) -> LoraBatch:
        """Contiguous token ranges per adapter (entries are already sorted by adapter); stacked form for
        decode-sized steps; one host segment per entry of a host-assisted adapter."""
        segments: list[LoraSegment] = []
        host_segments: list[LoraSegment] = []
        row = 0
        for entry in entries:
            end = row + entry.num_new_tokens
            adapter_id = entry.seq.adapter_id
            if adapter_id is not None and adapter_id in host_assisted:
                host_segments.append(LoraSegment(row, end, self.host_copies[adapter_id]))
            elif adapter_id is not None:
                last = segments[-1] if segments else None
                if last is not None and last.adapter.adapter_id == adapter_id and last.end == row:
                    segments[-1] = LoraSegment(last.start, end, last.adapter)
                else:
                    segments.append(LoraSegment(row, end, self.adapters[adapter_id]))
            row = end
        host = None
        if host_segments:
            switch = LayerSwitch(self._find_device_copy, host_assisted, self.host_switch_layer)
            host = HostLora(tuple(host_segments), switch, self._cpu_workers())
        if self.use_lora_kernel:
            return self._kernel_lora_batch(segments, host)
        if self.kernel_plan.decode_lora == "segmented" or not self._use_stacked(segments, row):
            return lora_batch(segmented_step(tuple(segments), self.kernel_plan.lora_wide_dtype), host)
        stacked = self._stacked_lora(tuple(seg.adapter for seg in segments))
        token_owner = torch.full((row,), -1, dtype=torch.long)
        for pos, seg in enumerate(segments):
            token_owner[seg.start:seg.end] = pos
        masks = stacked_masks(stacked, token_owner.to(self.device))
        return lora_batch(StackedStep(tuple(segments), stacked, masks), host)


    def _kernel_lora_batch(self, segments: list[LoraSegment], host: HostLora | None) -> LoraBatch:
        """Decode-sized segments through the CPU kernel (one call per projection for all of them), longer
        ones (prefill) through per-segment GEMMs."""
        short = tuple(seg for seg in segments if seg.end - seg.start <= MAX_KERNEL_SEGMENT_TOKENS)
        kernel = self._kernel_lora(tuple(seg.adapter for seg in short)) if short else None
        if kernel is None:
            return lora_batch(segmented_step(tuple(segments), self.kernel_plan.lora_wide_dtype), host)
        long = tuple(seg for seg in segments if seg.end - seg.start > MAX_KERNEL_SEGMENT_TOKENS)
        return lora_batch(KernelStep.of(kernel, short), segmented_step(long, self.kernel_plan.lora_wide_dtype), host)

    def _kernel_lora(self, adapters: tuple[LoraAdapter, ...]) -> KernelLora | None:
        """Kernel descriptors of an ordered adapter set (LRU-cached), or None when an adapter's tensors do not
        fit the kernel."""
        key = tuple(id(a) for a in adapters)
        kernel = self.kernel_sets.get(key)
        if kernel is not None:
            self.kernel_sets.move_to_end(key)
            return kernel
        descriptors = []
        for adapter in adapters:
            cached = self._kernel_descriptors.get(id(adapter))
            if cached is None or cached[0] is not adapter:
                cached = (adapter, adapter_descriptors(adapter))
                self._kernel_descriptors[id(adapter)] = cached
            if cached[1] is None:
                return None
            descriptors.append(cached[1])
        kernel = build_kernel_lora(adapters, descriptors)
        self.kernel_sets[key] = kernel
        while len(self.kernel_sets) > _KERNEL_SET_CACHE_SIZE:
            self.kernel_sets.popitem(last=False)
        return kernel


_KERNEL_SET_CACHE_SIZE = 64  # adapter sets whose kernel descriptors are kept (a few KiB each)


def _batch_equal_prefills(chunks: list[PrefillChunk]) -> list[PrefillChunk]:
    """Merge adjacent whole-prompt chunks of equal length into one batched chunk (one SDPA call)."""
    merged: list[PrefillChunk] = []
    for chunk in chunks:
        last = merged[-1] if merged else None
        if (
            last is not None
            and chunk.context_slots is None
            and last.context_slots is None
            and last.end == chunk.start
            and (last.end - last.start) // last.num_seqs == chunk.end - chunk.start
        ):
            merged[-1] = PrefillChunk(last.start, chunk.end, None, None, last.num_seqs + 1)
        else:
            merged.append(chunk)
    return merged
