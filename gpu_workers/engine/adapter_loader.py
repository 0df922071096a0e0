"""Load a PEFT LoRA directory into engine-ready LoraAdapter weights.

Validation is delegated to the pure `registry.validation` (the one place an adapter is checked against the
base model and limits); this module only packs already-validated tensors.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from gpu_workers.engine.errors import AdapterLoadError
from gpu_workers.engine.layers.lora import PROJECTIONS, LoraAdapter, LoraProjection, build_lora_projection
from registry.validation import (
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
) -> LoraAdapter:
    """Read validated lora_A/lora_B tensors and pack them per layer and merged projection.

    output_slices[projection][module] = (col_start, col_end) in that merged projection's output.
    """
    per_layer = _read_lora_tensors(Path(path) / WEIGHTS_FILENAME, num_layers)
    return pack_lora_adapter(
        adapter_id, per_layer, info.rank, info.scale, tuple(info.target_modules), output_slices, dtype, device
    )


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


def _read_lora_tensors(
    weights_path: Path, num_layers: int
) -> list[dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """-> per layer: module -> (lora_A [r, in], lora_B [out, r])."""
    halves: list[dict[str, dict[str, torch.Tensor]]] = [{} for _ in range(num_layers)]
    with safe_open(str(weights_path), framework="pt", device="cpu") as f:
        for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
            layer, module, side = parse_lora_tensor_name(name)
            halves[layer].setdefault(module, {})[side] = f.get_tensor(name)
    result: list[dict[str, tuple[torch.Tensor, torch.Tensor]]] = []
    for layer_idx, modules in enumerate(halves):
        pairs = {}
        for module, sides in modules.items():
            if set(sides) != {"A", "B"}:
                raise AdapterLoadError(f"layer {layer_idx} {module}: lora_A and lora_B must both be present")
            pairs[module] = (sides["A"], sides["B"])
        result.append(pairs)
    return result
