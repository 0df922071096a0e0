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
echo "setup: ready ($VENV)"
