#!/usr/bin/env bash
# Run the GPU tier (tests/gpu) on a GPU machine without internet, with the Python that
# already has PyTorch and nvidia-ml-py there, and mgpu's other packages carried as wheels.
#
#   scripts/gpu-test-offline.sh WHEEL_DIR [PYTHON] [pytest args...]
#
# WHEEL_DIR holds binary wheels for that machine's Python (docs/GPU.md says how to download
# them).  A virtual environment is made in $MGPU_GPU_VENV (default /tmp/mgpu-gpu-venv) that
# also sees PYTHON's own packages (a .pth file naming its site-packages: PYTHON may itself
# be a venv, which `--system-site-packages` would not see), the wheels are installed there
# from WHEEL_DIR alone (what PYTHON already has is kept), mgpu is put on its path from this
# checkout, and `pytest -v -rA tests/gpu` runs with that venv's python, so the master and
# agent the tests start (`mgpu` beside that python) use it too.
set -euo pipefail

wheels=$(realpath "${1:?usage: $0 WHEEL_DIR [PYTHON] [pytest args...]}")
python=${2:-python3}
shift $(($# < 2 ? $# : 2))
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${MGPU_GPU_VENV:-/tmp/mgpu-gpu-venv}

site_of() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }

"$python" -m venv --clear "$venv"
echo "$(site_of "$python")" >"$(site_of "$venv/bin/python")/base-python.pth"
echo "$repo/src" >"$(site_of "$venv/bin/python")/mgpu-checkout.pth"
"$venv/bin/python" -m pip install -q --no-index --find-links "$wheels" \
    fastapi 'uvicorn[standard]' orjson websockets pydantic PyYAML psutil prometheus-client \
    rich cryptography httpx uvloop 'psycopg[binary]' pytest pytest-timeout
cat >"$venv/bin/mgpu" <<EOF
#!$venv/bin/python
import sys
from mgpu.client.cli import main
sys.exit(main())
EOF
chmod +x "$venv/bin/mgpu"
# The GPU tier runs torchrun "next to this Python": the base Python's, where it has one.
base_bin=$(dirname "$(command -v "$python")")
[[ -x "$base_bin/torchrun" ]] && ln -sf "$base_bin/torchrun" "$venv/bin/torchrun"
"$venv/bin/python" -c 'import torch, pynvml, mgpu; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' || true
cd "$repo"
exec "$venv/bin/python" -m pytest -v -rA -p no:cacheprovider tests/gpu "$@"
