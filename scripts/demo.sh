#!/usr/bin/env bash
# `make demo`: a local cluster with a few example jobs, left running.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
PORT="${MGPU_DEMO_PORT:-8080}"
export MGPU_MASTER="127.0.0.1:$PORT"

mgpu up --port "$PORT"
echo
echo "\$ mgpu srun --gpus 1 -- sh -c 'echo hello from \$(hostname), GPU \$CUDA_VISIBLE_DEVICES'"
mgpu srun --gpus 1 -- sh -c 'echo hello from $(hostname), GPU $CUDA_VISIBLE_DEVICES'
echo
echo "\$ mgpu submit --gpus 2 --name train 'sleep 30'"
mgpu submit --gpus 2 --name train "sleep 30"
echo "\$ mgpu submit --gpus 4 --name big 'sleep 5'   # waits for the GPUs train holds"
mgpu submit --gpus 4 --name big "sleep 5"
echo "\$ mgpu submit --gpus 0 --name cpu-only 'echo no GPU: [\$CUDA_VISIBLE_DEVICES]'"
mgpu submit --gpus 0 --name cpu-only 'echo no GPU: [$CUDA_VISIBLE_DEVICES]'
sleep 1
echo
echo "\$ mgpu queue"
mgpu queue
echo
echo "The cluster keeps running. Try: . .venv/bin/activate; mgpu queue; mgpu logs JOB"
echo "Stop it with: mgpu down   (or: make down)"
