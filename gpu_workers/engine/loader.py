"""Local safetensors loading (single file or sharded with model.safetensors.index.json). No hub access."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open


def read_hf_config(model_dir: Path) -> dict[str, Any]:
    """The model's config.json as a dict."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{model_dir} has no config.json; point model_path at a HF model directory")
    return json.loads(path.read_text())


def safetensors_files(model_dir: Path) -> list[Path]:
    """Weight files of a model directory (sharded index first, else model.safetensors / *.safetensors)."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir} has no .safetensors weights (only safetensors are supported)")
    return files


def iter_safetensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, cpu tensor) for every tensor in the files."""
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                yield name, f.get_tensor(name)
