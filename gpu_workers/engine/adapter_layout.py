"""Adapter weights stored inside the KV cache's pages (the unified pool, EngineConfig.memory_mode "unified").

The page pool gives a resident adapter a contiguous run of pages [p0, p0 + n). In every layer a page is
two flat regions of the KV cache, `page_numel` = block_size * num_kv_heads * head_dim elements of K and as
many of V, so the run gives each layer two contiguous regions of n * page_numel elements (K then V). That
layer's LoRA tensors (per merged projection: A^T, then each sub-module's scaled B^T, as built by
layers/lora.py; then a DoRA adapter's fp32 magnitudes of the layer, layers/dora.py, viewed as page elements and
aligned) are laid out there in order, each whole in one region (first fit). LoRA on embed_tokens / lm_head
(layers/vocab_lora.py) follows the first layer's tensors (the embedding's) and the last layer's (the head's):
each vocab-sized tensor is whole in one region, so such an adapter takes at least vocab * rank / page_numel
pages in every layer. The adapter's tensors are
views of the KV cache: its device bytes are KV pages, counted once, and no memory outside the pool holds it.

Invariant: no sequence's block table contains a page of a resident adapter (the pool's partition), so KV
writes never touch adapter weights; decode padding may *read* such a page, and those scores are masked.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

import torch

from gpu_workers.engine.layers.lora import PROJECTIONS, LoraAdapter, LoraProjection
from gpu_workers.engine.layers.vocab_lora import VocabLora


def vocab_layers(vocab: VocabLora | None, num_layers: int) -> list[int]:
    """The layer whose pages hold each of `vocab.tensors()`, in order: the embedding's in the first layer, the
    head's in the last."""
    if vocab is None:
        return []
    num_embed = 0 if vocab.embed_rows is None else 2
    return [0 if i < num_embed else num_layers - 1 for i in range(len(vocab.tensors()))]


def vocab_numels(
    target_modules: Sequence[str], rank: int, vocab_size: int, hidden_size: int
) -> list[tuple[int, int]]:
    """(layer, elements) of each embed_tokens / lm_head LoRA tensor an adapter of this metadata will have, in
    VocabLora.tensors order with the layer of vocab_layers (-1: the last layer)."""
    numels: list[tuple[int, int]] = []
    if "embed_tokens" in target_modules:
        numels += [(0, vocab_size * rank), (0, rank * hidden_size)]  # A^T [vocab, r], s B^T [r, hidden]
    if "lm_head" in target_modules:
        numels += [(-1, hidden_size * rank), (-1, rank * vocab_size)]  # A^T [hidden, r], s B^T [r, vocab]
    return numels


def _tensors_in_order(
    projections: dict[str, LoraProjection], magnitudes: torch.Tensor | None
) -> Iterator[torch.Tensor]:
    for name in PROJECTIONS:
        proj = projections.get(name)
        if proj is None:
            continue
        yield proj.a_t
        for *_, b_t in proj.parts:
            yield b_t
    if magnitudes is not None:
        yield magnitudes


def page_elements(numel: int, element_size: int, page_element_size: int) -> int:
    """Page elements a tensor of `numel` elements takes (a wider dtype viewed in page elements, plus the slack
    to align its start)."""
    ratio = max(1, element_size // page_element_size)
    return numel * ratio + ratio - 1


def adapter_layer_numels(adapter: LoraAdapter, page_element_size: int) -> list[list[int]]:
    """Per layer, the page elements of its LoRA tensors (and DoRA magnitudes, and the embed_tokens / lm_head
    LoRA in the first / last layer) in layout order."""
    magnitudes: tuple[torch.Tensor | None, ...] = adapter.magnitudes or (None,) * len(adapter.layers)
    numels = [
        [
            page_elements(t.numel(), t.element_size(), page_element_size)
            for t in _tensors_in_order(layer, mags)
        ]
        for layer, mags in zip(adapter.layers, magnitudes)
    ]
    if adapter.vocab is not None:
        tensors = adapter.vocab.tensors()
        for layer_idx, t in zip(vocab_layers(adapter.vocab, len(numels)), tensors):
            numels[layer_idx].append(page_elements(t.numel(), t.element_size(), page_element_size))
    return numels


def layer_numels_for(
    rank: int,
    target_modules: Sequence[str],
    layers: Sequence[int],
    num_layers: int,
    in_features: dict[str, int],
    output_slices: dict[str, dict[str, tuple[int, int]]],
    dora_rows: int = 0,
    page_element_size: int = 4,
    vocab: Sequence[tuple[int, int]] = (),
) -> list[list[int]]:
    """The same element counts computed from an adapter's validated metadata (before any tensor exists).

    `in_features[projection]`, `output_slices[projection][module] = (col_start, col_end)`; `dora_rows` (DoRA
    adapters): rows of its fp32 magnitudes per layer (2 for a model with biases, else 1; 0: not DoRA);
    `vocab`: its embed_tokens / lm_head tensors (`vocab_numels`), in the engine dtype.
    """
    targeted = set(target_modules)
    per_layer: list[int] = []
    for projection, modules in PROJECTIONS.items():
        mods = [m for m in modules if m in targeted]
        if not mods:
            continue
        per_layer.append(in_features[projection] * rank * len(mods))  # A^T: [in, rank * len(mods)]
        per_layer.extend(
            rank * (output_slices[projection][m][1] - output_slices[projection][m][0]) for m in mods
        )
    # DoRA: every layer has its magnitudes (g = 1 in a layer without LoRA), after the layer's LoRA tensors
    magnitudes: list[int] = []
    if dora_rows:
        num_cols = sum(max(c1 for _, c1 in output_slices[p].values()) for p in PROJECTIONS)
        magnitudes.append(page_elements(dora_rows * num_cols, 4, page_element_size))
    has_layer = set(layers)
    numels = [(per_layer if i in has_layer else []) + magnitudes for i in range(num_layers)]
    for layer_idx, numel in vocab:
        numels[layer_idx].append(numel)
    return numels


def _fits(numels: list[int], capacity: int) -> bool:
    """First fit of the tensors, in order, into two regions (K, V) of `capacity` elements each."""
    region, used = 0, 0
    for numel in numels:
        if used + numel > capacity:
            region, used = region + 1, 0
            if region > 1 or numel > capacity:
                return False
        used += numel
    return True


def num_pages_for_layout(layer_numels: list[list[int]], page_numel: int) -> int:
    """Fewest pages whose two regions per layer hold every layer's tensors (0 for an empty adapter)."""
    largest = max((sum(n) for n in layer_numels), default=0)
    if largest == 0:
        return 0
    num_pages = max(1, -(-largest // (2 * page_numel)))
    while not all(_fits(n, num_pages * page_numel) for n in layer_numels):
        num_pages += 1
    return num_pages


def place_adapter(
    adapter: LoraAdapter,
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    page_ids: list[int],
    page_numel: int,
) -> LoraAdapter:
    """Copy an adapter's tensors into its page run of the KV cache; returns the adapter as views there.

    `page_ids` must be a contiguous ascending run (PagePool.reserve in a unified pool).
    """
    if not page_ids:
        return adapter
    p0, num_pages = page_ids[0], len(page_ids)
    if page_ids != list(range(p0, p0 + num_pages)):
        raise ValueError("an adapter in the unified pool needs a contiguous run of pages")
    capacity = num_pages * page_numel
    layers: list[dict[str, LoraProjection]] = []
    magnitudes: list[torch.Tensor] = []
    packers: list[_RegionPacker] = []
    for layer_idx, projections in enumerate(adapter.layers):
        k_cache, v_cache = kv_caches[layer_idx]
        regions = [
            k_cache.view(-1)[p0 * page_numel : p0 * page_numel + capacity],
            v_cache.view(-1)[p0 * page_numel : p0 * page_numel + capacity],
        ]
        packer = _RegionPacker(regions, capacity)
        packers.append(packer)

        placed: dict[str, LoraProjection] = {}
        for name in PROJECTIONS:
            proj = projections.get(name)
            if proj is None:
                continue
            a_t = packer.put(proj.a_t)
            parts = tuple((r0, r1, c0, c1, packer.put(b_t)) for r0, r1, c0, c1, b_t in proj.parts)
            placed[name] = LoraProjection(a_t=a_t, parts=parts)
        layers.append(placed)
        if adapter.magnitudes:
            magnitudes.append(packer.put(adapter.magnitudes[layer_idx]))
    vocab = None
    if adapter.vocab is not None:  # after each layer's own tensors, as adapter_layer_numels counts them
        owners = iter(packers[i] for i in vocab_layers(adapter.vocab, len(packers)))
        vocab = adapter.vocab.map(lambda t: next(owners).put(t))
    return replace(adapter, layers=tuple(layers), magnitudes=tuple(magnitudes), vocab=vocab)


class _RegionPacker:
    """Copies tensors one after another into the K region of a layer's pages, then its V region."""

    def __init__(self, regions: list[torch.Tensor], capacity: int) -> None:
        self.regions = regions
        self.capacity = capacity
        self.cursor = [0, 0]
        self.region = 0

    def put(self, tensor: torch.Tensor) -> torch.Tensor:
        """A view of the next free elements holding a copy of `tensor` (same shape; a wider dtype, DoRA's fp32
        magnitudes in bf16 pages, is viewed in page elements from an aligned start)."""
        page_element_size = self.regions[0].element_size()
        numel = page_elements(tensor.numel(), tensor.element_size(), page_element_size)
        if self.cursor[self.region] + numel > self.capacity:
            self.region += 1
            if self.region > 1 or numel > self.capacity:
                raise ValueError("the adapter's layout does not fit its pages")
        region = self.regions[self.region]
        ratio = max(1, tensor.element_size() // page_element_size)
        start = self.cursor[self.region]
        start += -(region.storage_offset() + start) % ratio
        view = region[start : start + tensor.numel() * ratio].view(tensor.dtype).view(tensor.shape)
        view.copy_(tensor, non_blocking=True)  # from pinned host memory on CUDA (a side stream)
        self.cursor[self.region] = self.cursor[self.region] + numel
        return view
