#!/usr/bin/env bash
# The next device run for issue 20, as THEN= of run-h200.sh, in priority order within DEADLINE seconds
# (default 500) of this script's start:
#   NO_COMPARE=1 SIZE=1b OUT=$OUT THEN='bash tools/bench/device/auto-h200.sh' bash tools/bench/device/run-h200.sh
# 1. check_cuda_kernels.py on the fused exact norms (bit for bit against MLX's ops; the check for a
#    change to their loads or partition, as the tenth session's load-first try).
# 2. qmv-decode.ts --ab ${AB:-exact-auto} on the 12B-shaped model: MLX's kernels against the default,
#    KL (must be 0) and tok/s with mlx-lm (DECODE_REPS repetitions, default 3).
# 3. One decode step of the 12B-shaped model under ncu, MLX's kernels and the default (the norms' µs a launch).
# 4. The same decode A/B on the 1B.
# AUTO_STEPS overrides the steps (qmv-h200.sh's names; "host" with HOST_PROF=100 profiles the default's build).
source "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"
DEADLINE="${DEADLINE:-500}"
CHECK_ONLY=mlxb_qkv_norm_exact,mlxb_q_norm_exact,mlxb_residual_norm_exact,mlxb_residual_exact CHECK_S=90 \
  NCU_FAST=auto REPS="${DECODE_REPS:-3}" TOKENS=128 KL_STEPS=16 QMV_DECODE_ARGS="--ab ${AB:-exact-auto}" \
  DEADLINE=$(($(secs_left) - 10)) STEPS="${AUTO_STEPS:-check decode12b ncu12b decode1b}" bash tools/kernels/qmv-h200.sh
echo "[auto-h200 +${SECONDS}s] done"
