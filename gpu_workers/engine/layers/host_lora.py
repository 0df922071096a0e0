"""CPU-assisted prefill (CaraServe): the LoRA delta of an adapter that is still being copied to the device,
computed from its host copy by a pool of CPU workers, until the device copy lands.

The base layers run on the device as usual. Per projection, each host-assisted segment (one scheduled
prefill entry) sends its rows of x and of the projection output to host memory, one CPU worker adds
x @ A @ B there with the host copy's tensors, and the device takes the rows back: y = xW + xAB. At every
layer boundary (`begin_layer`) the step checks whether an adapter's device copy has landed; from then on
its segments use the device copy (the same ops, `add_segment_delta`), for the rest of this step and for
every later one. On a CPU device the "host" rows are the output rows themselves (no copy), so the host
path runs exactly the device path's ops and results are bit-identical.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass

import torch

from gpu_workers.engine.layers.lora import (
    LoraAdapter,
    LoraProjection,
    LoraSegment,
    add_segment_delta,
    select_segment_rows,
)

FindDeviceCopy = Callable[[str, bool], "LoraAdapter | None"]
"""(adapter_id, wait) -> the landed device copy, or None (not landed yet; with wait=True: the copy failed)."""


class LayerSwitch:
    """Which host-assisted adapters of one step use their device copy from the current layer on.

    `switch_layer` is a deterministic test hook: None = switch at the first layer boundary after the copy
    lands; k = run layers [0, k) on the host copy whatever the copy does, then wait for it at layer k.
    """

    def __init__(
        self, find_device_copy: FindDeviceCopy, adapter_ids: frozenset[str], switch_layer: int | None
    ) -> None:
        self._find = find_device_copy
        self._adapter_ids = adapter_ids
        self._switch_layer = switch_layer
        self._device_copies: dict[str, LoraAdapter] = {}
        self.switched_at: dict[str, int] = {}  # adapter id -> first layer that used the device copy

    def begin_layer(self, layer_idx: int) -> None:
        """Switch the adapters whose device copy has landed (polled between layers)."""
        for adapter_id in self._adapter_ids - self._device_copies.keys():
            if self._switch_layer is None:
                device_copy = self._find(adapter_id, False)
            elif layer_idx >= self._switch_layer:
                device_copy = self._find(adapter_id, True)
            else:
                device_copy = None
            if device_copy is not None:
                self._device_copies[adapter_id] = device_copy
                self.switched_at[adapter_id] = layer_idx

    def device_copy(self, adapter_id: str) -> LoraAdapter | None:
        """The device copy once this step switched to it, else None (use the host copy)."""
        return self._device_copies.get(adapter_id)


@dataclass(frozen=True)
class HostLora:
    """Host-assisted segments of one step: `segments` hold the adapters' host copies (one per entry)."""

    segments: tuple[LoraSegment, ...]
    switch: LayerSwitch
    pool: Executor

    def begin_layer(self, layer_idx: int) -> None:
        """Poll the copies at a layer boundary (see LayerSwitch)."""
        self.switch.begin_layer(layer_idx)

    def select_rows(self, row_list: list[int]) -> HostLora:
        """The same segments over batch rows `row_list` (ascending), sharing the switch state."""
        return HostLora(select_segment_rows(self.segments, row_list), self.switch, self.pool)

    def add_delta(self, out: torch.Tensor, x: torch.Tensor, layer_idx: int, projection: str) -> None:
        """out[seg] += x[seg] @ A @ B for every host-assisted segment (host copy on a CPU worker, or the
        device copy once switched). out: [num_tokens, out_features]; x: [num_tokens, in_features]."""
        pending: list[tuple[LoraSegment, torch.Tensor, Future[None]]] = []
        for seg in self.segments:
            device_copy = self.switch.device_copy(seg.adapter.adapter_id)
            adapter = device_copy or seg.adapter
            proj = adapter.layers[layer_idx].get(projection)
            if proj is None:
                continue
            if device_copy is not None:
                add_segment_delta(out[seg.start : seg.end], x[seg.start : seg.end], proj)
                continue
            # On a CPU device .cpu() returns the rows themselves: the worker adds in place.
            out_rows, x_rows = out[seg.start : seg.end].cpu(), x[seg.start : seg.end].cpu()
            pending.append((seg, out_rows, self.pool.submit(_add_on_worker, out_rows, x_rows, proj)))
        for seg, out_rows, future in pending:
            future.result()
            if out_rows.device != out.device:
                out[seg.start : seg.end].copy_(out_rows)


def _add_on_worker(out_rows: torch.Tensor, x_rows: torch.Tensor, proj: LoraProjection) -> None:
    with torch.inference_mode():  # thread-local: the step's inference mode does not reach pool threads
        add_segment_delta(out_rows, x_rows, proj)
