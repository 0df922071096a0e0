"""The model directories engine_throughput.py and serving.py measure (base/ + adapters/): the generated demo
model or a real model's workload (benchmarks/engine_workload.py), each built once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


DEFAULT_MODEL_DIR = Path(os.path.expanduser("~/.cache/lorahost/bench-small-16"))


TARGET_MODULES = "q_proj,k_proj,v_proj,o_proj"


def real_model_dir(name: str, num_adapters: int) -> Path:
    """Cache directory of a real-model workload (`--real-model`)."""
    return Path(os.path.expanduser(f"~/.cache/lorahost/bench-{name}-{num_adapters}"))


def ensure_real_model(name: str, model_dir: Path, python: str, num_adapters: int) -> None:
    """Build a real model's workload once (benchmarks/engine_workload.py) when model_dir lacks it."""
    marker = model_dir / "adapters" / f"adapter-{num_adapters - 1:02d}" / "adapter_model.safetensors"
    if (model_dir / "base" / "config.json").exists() and (num_adapters == 0 or marker.exists()):
        return
    print(f"[engine_throughput] building the {name} workload into {model_dir}", file=sys.stderr)
    subprocess.run(
        [python, str(HERE / "engine_workload.py"), name, str(model_dir), "--num-adapters", str(num_adapters)],
        check=True,
        cwd=str(REPO),
        stdout=sys.stderr,
    )


def ensure_model(model_dir: Path, python: str, num_adapters: int, size: str) -> None:
    """Generate the demo model + adapters once (seeded) when the dir has no base model; a dir with
    base/config.json (any HF Llama-family model) is used as it is."""
    marker = model_dir / "adapters" / f"adapter-{num_adapters - 1:02d}" / "adapter_model.safetensors"
    if (model_dir / "base" / "config.json").exists():
        if not (model_dir / "adapters").is_dir():
            raise SystemExit(f"{model_dir} has base/ but no adapters/ folder of PEFT adapters")
        return
    if (model_dir / "base" / "model.safetensors").exists() and marker.exists():
        return
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    print(f"[engine_throughput] generating demo model into {model_dir}", file=sys.stderr)
    subprocess.run(
        [
            python,
            "-m",
            "lorahost.cli",
            "demo-model",
            str(model_dir),
            "--size",
            size,
            "--num-adapters",
            str(num_adapters),
            "--target-modules",
            TARGET_MODULES,
        ],
        check=True,
        cwd=str(REPO),
        stdout=sys.stderr,
    )
