#!/usr/bin/env bash
# The next device run for issue 20, as THEN= of run-h200.sh, in priority order within DEADLINE seconds
# (default 500) of this script's start:
#   NO_COMPARE=1 SIZE=1b OUT=$OUT THEN='bash tools/bench/device/auto-h200.sh' bash tools/bench/device/run-h200.sh
# 1. check_cuda_kernels.py --only mlxb_sdpa_decode_scores: the decode attention kernels against MLX's
#    CUDA ops (within one unit in the last place, at most 2% of values differing).
# 2. qmv-decode.ts --ab ${AB:-sdpa} on the 12B-shaped model, then on the 1B: MLX's kernels, the default,
#    the default with the decode attention kernels (MLX_BUN_SDPA_DECODE=on); teacher-forced KL against
#    the first (the default's must be 0; the kernels' must be <= 1e-4 to become a default) and tok/s
#    with mlx-lm (DECODE_REPS repetitions, default 3).
source "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"
DEADLINE="${DEADLINE:-500}"
CHECK_ONLY=mlxb_sdpa_decode_scores CHECK_S=90 REPS="${DECODE_REPS:-3}" TOKENS=128 KL_STEPS=16 QMV_DECODE_ARGS="--ab ${AB:-sdpa}" \
  DEADLINE=$(($(secs_left) - 10)) STEPS="check decode12b decode1b" bash tools/kernels/qmv-h200.sh
echo "[auto-h200 +${SECONDS}s] done"
