"""The LoRA side of a step: contiguous token ranges per adapter, and the form the multi-LoRA delta takes —
per-segment GEMMs, the stacked (owner-masked) form, the CPU kernel for decode-sized segments, or the grouped
Triton kernels on CUDA — with the caches each form keeps (stacked adapter sets, kernel and Triton descriptor
sets, per-adapter costs)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import TypeVar

import torch

from gpu_workers.engine.kernel_plan import KernelPlan
from gpu_workers.engine.layers.dora import dora_step
from gpu_workers.engine.layers.host_lora import HostLora
from gpu_workers.engine.layers.lora import LoraAdapter, LoraBatch, LoraSegment, lora_batch, segmented_step
from gpu_workers.engine.layers.lora_descriptors import adapter_descriptors
from gpu_workers.engine.layers.lora_kernel import (
    MAX_KERNEL_SEGMENT_TOKENS,
    KernelLora,
    KernelStep,
    build_kernel_lora,
)
from gpu_workers.engine.layers.stacked_lora import StackedLora, StackedStep, build_stacked_lora, stacked_masks
from gpu_workers.engine.layers.triton_lora import (
    MAX_BGMV_SEGMENT_ROWS,
    TRITON_LORA_FORMS,
    TritonLora,
    TritonStep,
    build_triton_lora,
)
from gpu_workers.engine.layers.vocab_lora import vocab_step
from scheduler.core.sequence import BatchEntry

# Cost model for choosing the LoRA form of a step (CPU-tuned, rough): a matmul-sized op costs ~20 us of
# fixed overhead; the stacked form multiplies every token by every adapter of the batch (wasted flops).
_OP_SECONDS = 20e-6
_FLOPS_PER_SECOND = 2.5e11
SetT = TypeVar("SetT")
_KERNEL_SET_CACHE_SIZE = 64  # adapter sets whose kernel (or Triton) descriptors are kept (a few KiB each)


def lora_segments(
    entries: list[BatchEntry],
    adapters: Mapping[str, LoraAdapter],
    host_copies: Mapping[str, LoraAdapter],
    host_assisted: frozenset[str],
) -> tuple[list[LoraSegment], list[LoraSegment], int]:
    """(device segments, host segments, num_tokens) of a batch whose entries are sorted by adapter: one
    merged segment per run of an adapter's device copy, one host segment per entry of a host-assisted
    adapter (its host copy)."""
    segments: list[LoraSegment] = []
    host_segments: list[LoraSegment] = []
    row = 0
    for entry in entries:
        end = row + entry.num_new_tokens
        adapter_id = entry.seq.adapter_id
        if adapter_id is not None and adapter_id in host_assisted:
            host_segments.append(LoraSegment(row, end, host_copies[adapter_id]))
        elif adapter_id is not None:
            last = segments[-1] if segments else None
            if last is not None and last.adapter.adapter_id == adapter_id and last.end == row:
                segments[-1] = LoraSegment(last.start, end, last.adapter)
            else:
                segments.append(LoraSegment(row, end, adapters[adapter_id]))
        row = end
    return segments, host_segments, row


class LoraForms:
    """Picks the multi-LoRA form of each step and keeps the stacked and kernel caches.

    Caches are keyed by the ordered adapter objects' ids; an entry holds its adapters, so a reloaded adapter
    gets a new key. `forget` drops an adapter's entries when it is unloaded or replaced.
    """

    def __init__(
        self,
        kernel_plan: KernelPlan,
        max_stack_sets: int,
        is_packed: bool,
        device: torch.device,
        adapters: Mapping[str, LoraAdapter],
        dora_columns: Mapping[str, tuple[int, int]],
    ) -> None:
        self.kernel_plan = kernel_plan
        self.max_stack_sets = max_stack_sets  # config.lora_stack_cache_size; 0 disables the stacked form
        self.is_packed = is_packed  # stacked sets packed like the model's packed linears
        self.device = device
        self._adapters = adapters  # the runner's device adapters (bounds the cost cache)
        self.dora_columns = dora_columns  # each projection's columns in a DoRA adapter's magnitudes
        # CPU kernel for decode-sized segments (layers/lora_kernel.py) where the plan chose it: built (or
        # loaded from the cache, layers/cpu_kernels.py) before the first request.
        self.use_lora_kernel = kernel_plan.decode_lora == "kernel"
        self.lora_stacks: OrderedDict[tuple[int, ...], StackedLora] = OrderedDict()  # LRU
        self.num_lora_stack_builds = 0
        self.kernel_sets: OrderedDict[tuple[int, ...], KernelLora] = OrderedDict()  # LRU
        self.triton_sets: OrderedDict[tuple[int, ...], TritonLora] = OrderedDict()  # LRU, on the device
        self._kernel_descriptors: dict[int, tuple[LoraAdapter, torch.Tensor | None]] = {}
        self._adapter_cost: dict[int, tuple[int, int]] = {}  # id(adapter) -> (ops per step, elements)

    def batch(self, segments: list[LoraSegment], num_tokens: int, host: HostLora | None) -> LoraBatch:
        """The step's LoraBatch over device `segments` (sorted by adapter) and the host-assisted part; DoRA rows
        (of either) rescaled last, whatever the form (layers/dora.py); the embed_tokens / lm_head deltas of
        either in a VocabStep (layers/vocab_lora.py)."""
        lora = self._delta_batch(segments, num_tokens, host)
        every = [*segments, *(host.segments if host is not None else ())]
        dora = dora_step(every, num_tokens, self.dora_columns)
        return lora_batch(*lora.forms, dora, vocab_step(every, num_tokens))

    def _delta_batch(self, segments: list[LoraSegment], num_tokens: int, host: HostLora | None) -> LoraBatch:
        """The LoRA deltas of the step in the form the plan and the cost model pick."""
        if self.use_lora_kernel:
            return self._kernel_lora_batch(segments, host)
        if self.kernel_plan.decode_lora in TRITON_LORA_FORMS:
            return self._triton_lora_batch(segments, host)
        if self.kernel_plan.decode_lora == "segmented" or not self._use_stacked(segments, num_tokens):
            return lora_batch(segmented_step(tuple(segments), self.kernel_plan.lora_wide_dtype), host)
        stacked = self._stacked_lora(tuple(seg.adapter for seg in segments))
        token_owner = torch.full((num_tokens,), -1, dtype=torch.long)
        for pos, seg in enumerate(segments):
            token_owner[seg.start : seg.end] = pos
        masks = stacked_masks(stacked, token_owner.to(self.device))
        return lora_batch(StackedStep(tuple(segments), stacked, masks), host)

    def forget(self, adapter_id: str) -> None:
        """Drop cached sets that include an adapter (call when it is unloaded or replaced)."""
        for key in [
            k for k, v in self.lora_stacks.items() if any(a.adapter_id == adapter_id for a in v.adapters)
        ]:
            del self.lora_stacks[key]
        for sets in (self.kernel_sets, self.triton_sets):
            for key in [k for k, v in sets.items() if any(a.adapter_id == adapter_id for a in v.adapters)]:
                del sets[key]
        for object_id in [k for k, (a, _) in self._kernel_descriptors.items() if a.adapter_id == adapter_id]:
            del self._kernel_descriptors[object_id]
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
                p.a_t.numel() + sum(b.numel() for *_, b in p.parts)
                for layer in adapter.layers
                for p in layer.values()
            )
            cost = (ops, elems)
            if len(self._adapter_cost) > 4 * max(len(self._adapters), 64):
                self._adapter_cost.clear()
            self._adapter_cost[id(adapter)] = cost
        return cost

    def _use_stacked(self, segments: list[LoraSegment], num_tokens: int) -> bool:
        """Stacked when its wasted flops cost less than the segment loop's per-op overhead."""
        if len(segments) < 2 or self.max_stack_sets <= 0:
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
        stacked = build_stacked_lora(adapters, pack=self.is_packed)
        self.num_lora_stack_builds += 1
        self.lora_stacks[key] = stacked
        while len(self.lora_stacks) > self.max_stack_sets:
            self.lora_stacks.popitem(last=False)
        return stacked

    def _kernel_lora_batch(self, segments: list[LoraSegment], host: HostLora | None) -> LoraBatch:
        """Decode-sized segments through the CPU kernel (one call per projection for all of them), longer
        ones (prefill) through per-segment GEMMs."""
        wide_dtype = self.kernel_plan.lora_wide_dtype
        short = tuple(seg for seg in segments if seg.end - seg.start <= MAX_KERNEL_SEGMENT_TOKENS)
        kernel = self._kernel_lora(tuple(seg.adapter for seg in short)) if short else None
        if kernel is None:
            return lora_batch(segmented_step(tuple(segments), wide_dtype), host)
        long = tuple(seg for seg in segments if seg.end - seg.start > MAX_KERNEL_SEGMENT_TOKENS)
        return lora_batch(KernelStep.of(kernel, short), segmented_step(long, wide_dtype), host)

    def _kernel_lora(self, adapters: tuple[LoraAdapter, ...]) -> KernelLora | None:
        """Kernel descriptors of an ordered adapter set (LRU-cached), or None when an adapter's tensors do not
        fit the kernel."""
        key = tuple(id(a) for a in adapters)
        kernel = self.kernel_sets.get(key)
        if kernel is not None:
            self.kernel_sets.move_to_end(key)
            return kernel
        descriptors = self._descriptors(adapters)
        if descriptors is None:
            return None
        kernel = build_kernel_lora(adapters, descriptors)
        _put_lru(self.kernel_sets, key, kernel)
        return kernel

    def _triton_lora_batch(self, segments: list[LoraSegment], host: HostLora | None) -> LoraBatch:
        """Every segment through the Triton kernels: decode-sized ones through BGMV when the plan chose "bgmv",
        the rest through SGMV (per-segment GEMMs when an adapter's tensors do not fit the descriptors)."""
        adapters = tuple({id(seg.adapter): seg.adapter for seg in segments}.values())
        lora = self._triton_lora(adapters) if adapters else None
        if lora is None:
            return lora_batch(segmented_step(tuple(segments), self.kernel_plan.lora_wide_dtype), host)
        max_bgmv_rows = MAX_BGMV_SEGMENT_ROWS if self.kernel_plan.decode_lora == "bgmv" else 0
        return lora_batch(TritonStep.of(lora, tuple(segments), max_bgmv_rows), host)

    def _triton_lora(self, adapters: tuple[LoraAdapter, ...]) -> TritonLora | None:
        """Device descriptors of an ordered adapter set (LRU-cached), or None when they do not fit."""
        key = tuple(id(a) for a in adapters)
        lora = self.triton_sets.get(key)
        if lora is not None:
            self.triton_sets.move_to_end(key)
            return lora
        descriptors = self._descriptors(adapters)
        if descriptors is None:
            return None
        lora = build_triton_lora(adapters, descriptors, self.device)
        _put_lru(self.triton_sets, key, lora)
        return lora

    def _descriptors(self, adapters: tuple[LoraAdapter, ...]) -> list[torch.Tensor] | None:
        """Each adapter's descriptors (cached per adapter object), or None when one does not fit."""
        descriptors = []
        for adapter in adapters:
            cached = self._kernel_descriptors.get(id(adapter))
            if cached is None or cached[0] is not adapter:
                cached = (adapter, adapter_descriptors(adapter))
                self._kernel_descriptors[id(adapter)] = cached
            if cached[1] is None:
                return None
            descriptors.append(cached[1])
        return descriptors


def _put_lru(sets: OrderedDict[tuple[int, ...], SetT], key: tuple[int, ...], value: SetT) -> None:
    sets[key] = value
    while len(sets) > _KERNEL_SET_CACHE_SIZE:
        sets.popitem(last=False)
