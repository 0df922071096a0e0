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

MOTO_PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$VENV/bin/moto_server" -H 127.0.0.1 -p "$MOTO_PORT" >/tmp/lorahost-moto-$MOTO_PORT.log 2>&1 &
MOTO_PID=$!
trap 'kill $MOTO_PID 2>/dev/null || true' EXIT
for _ in $(seq 1 50); do
  "$PY" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$MOTO_PORT/')" 2>/dev/null && break
  sleep 0.2
done
export LORAHOST_TEST_S3_ENDPOINT="http://127.0.0.1:$MOTO_PORT"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec "$VENV/bin/pytest" -q -m "not slow" -n "${LORAHOST_TEST_WORKERS:-2}" "$@"
