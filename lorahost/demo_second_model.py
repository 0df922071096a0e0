"""The demo's second base model (issue 24): a small generated Llama of another shape (the `tiny64` demo size,
seeded random weights) added to the catalog with `lorahost models add` while the server runs, one adapter
uploaded for it with the `base_model` field, and its answers beside its base model's: `lorahost serve` starts
its in-process worker on the first request (lorahost/embedded_models.py)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from lorahost.dev_services import run_cli

SECOND_MODEL = "tiny-second"


@dataclass(frozen=True)
class SecondModel:
    """The second base model's directory and the adapter the demo uploads for it."""

    name: str
    base_dir: Path
    adapter_dir: Path


def prepare_second_model(data_dir: Path) -> SecondModel:
    """Generate the second model and one adapter for it once into data_dir/second-model (cached)."""
    from gpu_workers.engine.demo_model import generate_demo

    out = data_dir / "second-model"
    if not (out / "base" / "config.json").is_file():
        generate_demo(out, size="tiny64", num_adapters=1, seed=7)
    adapter_dir = min((out / "adapters").iterdir())
    return SecondModel(SECOND_MODEL, out / "base", adapter_dir)


def add_to_catalog(data_dir: Path, model: SecondModel) -> str:
    """`lorahost models add NAME --from DIR` unless the catalog has it; returns what the command printed."""
    env = dict(os.environ)
    printed = run_cli(["models", "list", "--json", "--data-dir", str(data_dir)], env)
    if any(json.loads(line)["name"] == model.name for line in printed.splitlines() if line.strip()):
        return f"{model.name} is already in the catalog"
    added = run_cli(
        ["models", "add", model.name, "--from", str(model.base_dir), "--data-dir", str(data_dir)], env
    )
    return added.strip()
