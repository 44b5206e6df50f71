#!/usr/bin/env bash
# The next device run for issue 20, as THEN= of run-h200.sh, in priority order within DEADLINE seconds
# (default 500) of this script's start:
#   NO_COMPARE=1 SIZE=1b OUT=$OUT THEN='bash tools/bench/device/auto-h200.sh' bash tools/bench/device/run-h200.sh
# 1. direct-launch-check.ts: direct launches against MLX's CustomKernel path, bit for bit.
# 2. launch-encode.ts: what MLX's encode costs per op kind of a 12B step (µs a call), both launch paths.
# 3. qmv-decode.ts --ab ${AB:-direct} on the 12B-shaped model: MLX's kernels, the default on MLX's launch path,
#    the default (direct launches); KL (must be 0) and tok/s with mlx-lm (DECODE_REPS, default 3).
# 4. decode-graph.ts --all: the op nodes of one 12B step per primitive (what MLX encodes besides launches).
# 5. The same decode A/B on the 1B.
# 6. One decode step of the 12B-shaped model under ncu, MLX's kernels and the default.
# Also available: check (check_cuda_kernels.py on CHECK_ONLY, default the GeGLU launch, which failed its
# bit check in the twelfth session; it now also checks the launch's gate and up rows alone), pvfold (pv-fold-check.py: the folded p·v differs from MLX's in 2 of 96).
# AUTO_STEPS overrides the steps (qmv-h200.sh's names; "host" with HOST_PROF=100 profiles the default's build;
# CHECK_ONLY the kernels the check runs).
source "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"
DEADLINE="${DEADLINE:-500}"
CHECK_ONLY="${CHECK_ONLY:-mlxb_qmv_exact_geglu}" CHECK_S=90 \
  NCU_FAST=auto REPS="${DECODE_REPS:-3}" TOKENS=128 KL_STEPS=16 QMV_DECODE_ARGS="--ab ${AB:-direct}" QMV_DECODE_ARGS_NO_DIRECT="--ab ${AB_NO_DIRECT:-exact-auto}" \
  DEADLINE=$(($(secs_left) - 10)) STEPS="${AUTO_STEPS:-direct encode decode12b graph decode1b ncu12b}" bash tools/kernels/qmv-h200.sh
# MLX writes each JIT module's generated source next to its PTX: keep the compiled GeGLU kernels'
# (the tape mlxb_geglu_exact follows), for reading where the GPU check disagrees.
if [ -n "${MLX_PTX_CACHE_DIR:-}" ] && [ -d "$MLX_PTX_CACHE_DIR" ]; then
  mkdir -p "${OUT:-/tmp/h200-out}/jit-geglu"
  # Compiled modules are named by their tape (the GeGLU's: …V2IPowerDEG…, …V2ITanhO…), possibly split into directories.
  find "$MLX_PTX_CACHE_DIR" -name '*.cu' \( -path '*V2IPower*' -o -path '*V2ITanh*' \) | head -8 | xargs -r cp --backup=numbered -t "${OUT:-/tmp/h200-out}/jit-geglu/"
fi
echo "[auto-h200 +${SECONDS}s] done"
