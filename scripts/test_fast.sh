#!/usr/bin/env bash
# The fast tier: every test not marked slow, on both cores (pytest-xdist, one torch thread per worker), with
# pytest's rewritten test modules cached between runs; no setup, lint or vLLM step (scripts/test.sh runs those
# and every test). Needs the venv (scripts/setup.sh) and the services (scripts/services.sh). Extra arguments
# go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${LORAHOST_VENV:-.venv}"
PY="$VENV/bin/python"
unset PYTHONDONTWRITEBYTECODE

source scripts/moto.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec "$VENV/bin/pytest" -q -m "not slow" -n "${LORAHOST_TEST_WORKERS:-2}" "$@"
