#!/usr/bin/env bash
# One command: set up the virtualenv, start PostgreSQL/Redis if needed, start a moto S3 server,
# check package boundaries, lint, format and types, and run the whole test suite, then the engine contract suite
# on vLLM in its own venv (scripts/test_vllm.sh). Extra arguments go to pytest (and skip the vLLM step).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/services.sh
VENV="${LORAHOST_VENV:-.venv}"
PY="$VENV/bin/python"

# moto's S3 server on a free local port, stopped when this script exits.
source scripts/moto.sh
# Debian's chromium for the console's browser tests (Playwright never downloads a browser here).
bash scripts/chromium.sh

echo "== import boundaries (import-linter) =="
"$VENV/bin/lint-imports"

echo "== lint (ruff check, ruff format --check) =="
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .

echo "== types (mypy: checked everywhere, strict on scheduler/, cluster/ and twin/; pyproject.toml [tool.mypy]) =="
"$VENV/bin/mypy"

echo "== tests =="
set +e
"$VENV/bin/pytest" -q "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing"; exit 1
fi
[ "$rc" -eq 0 ] || exit "$rc"

# The engine contract suite on vLLM, in its own venv (skip with LORAHOST_SKIP_VLLM=1, or when pytest got
# arguments: a selection of the main suite).
if [ "${LORAHOST_SKIP_VLLM:-0}" != "1" ] && [ "$#" -eq 0 ]; then
  echo "== the engine contract suite on vLLM (scripts/test_vllm.sh) =="
  bash scripts/test_vllm.sh
fi
