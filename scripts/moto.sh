# Sourced by scripts/test.sh and scripts/test_fast.sh (needs VENV and PY): moto's S3 server on a free local
# port for the tests (LORAHOST_TEST_S3_ENDPOINT), stopped when the sourcing script exits.
MOTO_PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$VENV/bin/moto_server" -H 127.0.0.1 -p "$MOTO_PORT" >/tmp/lorahost-moto-$MOTO_PORT.log 2>&1 &
MOTO_PID=$!
trap 'kill $MOTO_PID 2>/dev/null || true' EXIT
for _ in $(seq 1 50); do
  "$PY" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$MOTO_PORT/')" 2>/dev/null && break
  sleep 0.2
done
export LORAHOST_TEST_S3_ENDPOINT="http://127.0.0.1:$MOTO_PORT"
