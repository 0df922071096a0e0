#!/usr/bin/env bash
# One command: set up the virtualenv and run the platform end to end on embedded defaults.
# Extra arguments go to `lorahost demo` (e.g. --port 8000 --keep-serving).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${LORAHOST_VENV:-.venv}/bin/lorahost" demo "$@"
