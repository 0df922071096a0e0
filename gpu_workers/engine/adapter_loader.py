"""Load a PEFT LoRA directory into engine-ready LoraAdapter weights.

Validation is delegated to the pure `registry.validation` (the one place an adapter is checked against the
base model and limits); this module only packs already-validated tensors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import torch
from safetensors import safe_open

from gpu_workers.engine.errors import AdapterLoadError
from gpu_workers.engine.layers.dora import BaseProjection, dora_magnitudes
from gpu_workers.engine.layers.lora import PROJECTIONS, LoraAdapter, LoraProjection, build_lora_projection
from gpu_workers.engine.layers.vocab_lora import build_vocab_lora
from registry.validation import (
    VOCAB_LAYER,
    AdapterInfo,
    AdapterValidationError,
    BaseModelSpec,
    ValidationLimits,
    parse_lora_tensor_name,
    validate_adapter_dir,
)

WEIGHTS_FILENAME = "adapter_model.safetensors"


def validate_adapter(path: Path, spec: BaseModelSpec, limits: ValidationLimits) -> AdapterInfo:
    """Validate an adapter directory; raises AdapterLoadError with the validator's reason."""
    try:
        return validate_adapter_dir(Path(path), spec, limits)
    except AdapterValidationError as exc:
        raise AdapterLoadError(f"adapter at {path} is invalid: {exc}") from exc


def load_lora_adapter(
    adapter_id: str,
    path: Path,
    info: AdapterInfo,
    output_slices: dict[str, dict[str, tuple[int, int]]],
    num_layers: int,
    dtype: torch.dtype,
    device: torch.device,
    base_layers: Sequence[Mapping[str, BaseProjection]] = (),
) -> LoraAdapter:
    """Read validated lora_A/lora_B tensors and pack them per layer and merged projection.

    output_slices[projection][module] = (col_start, col_end) in that merged projection's output. A DoRA
    adapter's rescale is computed here, once, against `base_layers` (the worker's base projections per layer,
    layers/dora.py). LoRA on embed_tokens / lm_head is packed beside the layers (layers/vocab_lora.py).
    """
    per_layer, magnitudes, vocab_pairs = _read_lora_tensors(Path(path) / WEIGHTS_FILENAME, num_layers)
    adapter = pack_lora_adapter(
        adapter_id, per_layer, info.rank, info.scale, tuple(info.target_modules), output_slices, dtype, device
    )
    vocab = build_vocab_lora(vocab_pairs, info.scale, dtype, device)
    if vocab is not None:
        adapter = replace(adapter, vocab=vocab, num_bytes=adapter.num_bytes + vocab.num_bytes)
    if not info.use_dora:
        return adapter
    if not base_layers:
        raise AdapterLoadError(f"adapter {adapter_id!r} is a DoRA adapter: loading it needs the base weights")
    rescale = dora_magnitudes(per_layer, magnitudes, info.scale, base_layers, output_slices, device)
    return with_magnitudes(adapter, rescale)


def with_magnitudes(adapter: LoraAdapter, magnitudes: tuple[torch.Tensor, ...]) -> LoraAdapter:
    """The adapter as a DoRA adapter with these rescales (layers/dora.py), their bytes counted in num_bytes."""
    extra = sum(t.numel() * t.element_size() for t in magnitudes)
    return replace(adapter, num_bytes=adapter.num_bytes + extra, magnitudes=magnitudes)


def pack_lora_adapter(
    adapter_id: str,
    per_layer: list[dict[str, tuple[torch.Tensor, torch.Tensor]]],
    rank: int,
    scale: float,
    target_modules: tuple[str, ...],
    output_slices: dict[str, dict[str, tuple[int, int]]],
    dtype: torch.dtype,
    device: torch.device,
) -> LoraAdapter:
    """Pack per-layer HF pairs (module -> (lora_A [r, in], lora_B [out, r])) per merged projection, the scale
    folded into B: the files' tensors (load_lora_adapter) or tensors a caller made (benchmarks generate them
    on the device)."""
    layers: list[dict[str, LoraProjection]] = []
    for modules in per_layer:
        packed: dict[str, LoraProjection] = {}
        for projection in PROJECTIONS:
            proj = build_lora_projection(modules, projection, output_slices[projection], scale, dtype, device)
            if proj is not None:
                packed[projection] = proj
        layers.append(packed)
    num_bytes = sum(
        p.a_t.numel() * p.a_t.element_size() + sum(b.numel() * b.element_size() for *_, b in p.parts)
        for layer in layers
        for p in layer.values()
    )
    return LoraAdapter(
        adapter_id=adapter_id,
        rank=rank,
        scale=scale,
        target_modules=target_modules,
        layers=tuple(layers),
        num_bytes=num_bytes,
    )


Pairs = dict[str, tuple[torch.Tensor, torch.Tensor]]


def _read_lora_tensors(
    weights_path: Path, num_layers: int
) -> tuple[list[Pairs], list[dict[str, torch.Tensor]], Pairs]:
    """-> per layer: module -> (lora_A [r, in], lora_B [out, r]); per layer: module -> DoRA magnitude [out]
    (empty for plain LoRA); embed_tokens / lm_head -> their (A, B) (empty when not targeted)."""
    halves: list[dict[str, dict[str, torch.Tensor]]] = [{} for _ in range(num_layers)]
    vocab_halves: dict[str, dict[str, torch.Tensor]] = {}
    with safe_open(str(weights_path), framework="pt", device="cpu") as f:
        for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
            layer, module, side = parse_lora_tensor_name(name)
            modules = vocab_halves if layer == VOCAB_LAYER else halves[layer]
            modules.setdefault(module, {})[side] = f.get_tensor(name)
    result = [_pairs(modules, f"layer {i}") for i, modules in enumerate(halves)]
    magnitudes = [
        {module: sides["M"] for module, sides in modules.items() if "M" in sides} for modules in halves
    ]
    return result, magnitudes, _pairs(vocab_halves, "model")


def _pairs(modules: dict[str, dict[str, torch.Tensor]], where: str) -> Pairs:
    pairs = {}
    for module, sides in modules.items():
        if not {"A", "B"} <= set(sides):
            raise AdapterLoadError(f"{where} {module}: lora_A and lora_B must both be present")
        pairs[module] = (sides["A"], sides["B"])
    return pairs
