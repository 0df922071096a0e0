"""The LoRA delta of a captured decode step: BGMV (layers/triton_lora.py) over a device-resident table of adapter
descriptors indexed by slot, each row's slot read from a static buffer.

A captured step must not depend on which adapters the batch holds: its kernels' grids and arguments are fixed at
capture. So the step reads
- `AdapterSlots.desc`: [num_slots, num_layers, len(PROJECTIONS), DESC_STRIDE] int64 at a fixed address; a slot's
  rows are the descriptors of the adapter that holds it (layers/lora_descriptors.py), written when the adapter
  takes the slot (a small host -> device copy, once per adapter while it keeps its slot);
- `row_slot`: [num_rows] int64, the slot of each row's adapter (-1: none), copied in before every replay;
- grids sized by `slot_bounds`: the largest rank columns, part width and parts any adapter within the engine's
  rank limit can have on each projection. Programs past a row's own adapter's rank or parts exit at once (the
  kernels read the rank from the descriptor), so a small adapter costs its own rank, as in the eager BGMV form.
A new mix of adapters changes only the contents of these buffers: nothing is captured again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from gpu_workers.engine.layers.lora import LoraAdapter
from gpu_workers.engine.layers.lora_descriptors import DESC_STRIDE, PROJECTION_INDEX, adapter_descriptors
from gpu_workers.engine.layers.triton_lora import (
    DEFAULT_LAUNCH,
    LaunchBounds,
    LaunchConfig,
    bgmv_expand,
    bgmv_shrink,
    launch_bounds,
    shrink_buffer,
)

NO_SLOT = -1


def slot_bounds(
    slices: Mapping[str, tuple[int, Mapping[str, tuple[int, int]]]], max_lora_rank: int
) -> dict[str, LaunchBounds]:
    """Per projection, the launch bounds of any adapter of rank <= max_lora_rank: every module of the
    projection targeted at that rank (`slices`: lora_forms.projection_slices of the model)."""
    return {
        projection: LaunchBounds(
            max_rank_cols=len(outputs) * max_lora_rank,
            max_part_cols=max(c1 - c0 for c0, c1 in outputs.values()),
            max_parts=len(outputs),
        )
        for projection, (_, outputs) in slices.items()
    }


def fits_bounds(desc: torch.Tensor, bounds: Mapping[str, LaunchBounds]) -> bool:
    """True when an adapter's descriptors desc: [num_layers, len(PROJECTIONS), DESC_STRIDE] stay within
    `bounds` on every layer and projection."""
    for layer in launch_bounds(desc.unsqueeze(0)):
        for projection, own in layer.items():
            limit = bounds[projection]
            if (
                own.max_rank_cols > limit.max_rank_cols
                or own.max_part_cols > limit.max_part_cols
                or own.max_parts > limit.max_parts
            ):
                return False
    return True


class AdapterSlots:
    """The device table of adapter descriptors indexed by slot, and which adapter holds which slot (least recently
    used gives way). Entries hold their adapter, so an object id is not reused while it has a slot; `forget` frees
    an unloaded adapter's slot."""

    def __init__(
        self, num_slots: int, num_layers: int, bounds: Mapping[str, LaunchBounds], device: torch.device
    ) -> None:
        self.num_slots = num_slots
        self.bounds = dict(bounds)
        # [num_slots, num_layers, len(PROJECTIONS), DESC_STRIDE]; an all-zero row targets nothing
        self.desc = torch.zeros(
            num_slots, num_layers, len(PROJECTION_INDEX), DESC_STRIDE, dtype=torch.int64, device=device
        )
        self._held: OrderedDict[int, tuple[LoraAdapter, int]] = OrderedDict()  # id(adapter) -> (it, slot)
        self._free = list(range(num_slots - 1, -1, -1))
        self.num_writes = 0

    def slots_of(self, adapters: Sequence[LoraAdapter]) -> list[int] | None:
        """The slot of each adapter (distinct objects, at most num_slots), giving slots to those without one; None
        when one cannot be served from the table (its tensors do not fit the descriptors or the bounds)."""
        if len(adapters) > self.num_slots:
            return None
        wanted = {id(adapter) for adapter in adapters}
        slots = []
        for adapter in adapters:
            slot = self._slot_of(adapter, wanted)
            if slot is None:
                return None
            slots.append(slot)
        return slots

    def projection_desc(self, layer_idx: int, projection: str) -> torch.Tensor:
        """[num_slots, DESC_STRIDE] view: every slot's descriptor row of one (layer, projection)."""
        return self.desc[:, layer_idx, PROJECTION_INDEX[projection]]

    def forget(self, adapter_id: str) -> None:
        """Free the slots of an unloaded (or replaced) adapter."""
        for key in [k for k, (adapter, _) in self._held.items() if adapter.adapter_id == adapter_id]:
            _, slot = self._held.pop(key)
            self.desc[slot].zero_()
            self._free.append(slot)

    def _slot_of(self, adapter: LoraAdapter, wanted: set[int]) -> int | None:
        held = self._held.get(id(adapter))
        if held is not None and held[0] is adapter:
            self._held.move_to_end(id(adapter))
            return held[1]
        desc = adapter_descriptors(adapter)
        if desc is None or not fits_bounds(desc, self.bounds):
            return None
        slot = self._take_slot(wanted)
        self.desc[slot].copy_(desc)
        self._held[id(adapter)] = (adapter, slot)
        self.num_writes += 1
        return slot

    def _take_slot(self, wanted: set[int]) -> int:
        """A free slot, else the least recently used one whose adapter this step does not use."""
        if self._free:
            return self._free.pop()
        victim = next(key for key in self._held if key not in wanted)
        return self._held.pop(victim)[1]


@dataclass(frozen=True)
class SlotStep:
    """The delta of rows whose adapters hold slots of `slots`: one BGMV shrink and one expand per projection, grids
    sized by `bounds` (layers/triton_lora.py; graph-safe: see the module doc)."""

    slots: AdapterSlots
    row_slot: torch.Tensor  # [num_rows] int64, NO_SLOT where a row has no adapter
    config: LaunchConfig = DEFAULT_LAUNCH

    def add_delta(self, out: torch.Tensor, x: torch.Tensor, layer_idx: int, projection: str) -> None:
        """out[row] += x[row] @ A @ B of each row's adapter. out: [num_rows, out_features] (rows contiguous,
        updated in place); x: [num_rows, in_features]."""
        bounds = self.slots.bounds[projection]
        assert out.stride(1) == 1
        x = x if x.stride(1) == 1 else x.contiguous()
        desc = self.slots.projection_desc(layer_idx, projection)
        h = shrink_buffer(x.shape[0], bounds, x.device)
        bgmv_shrink(h, x, desc, self.row_slot, bounds, self.config)
        bgmv_expand(out, h, desc, self.row_slot, bounds, None, self.config)

    def select_rows(self, row_list: list[int]) -> SlotStep | None:
        """The same slots over batch rows `row_list` (ascending), renumbered."""
        index = torch.tensor(row_list, dtype=torch.long, device=self.row_slot.device)
        return SlotStep(self.slots, self.row_slot.index_select(0, index), self.config)

    def begin_layer(self, layer_idx: int) -> None:
        """Nothing changes between layers."""
