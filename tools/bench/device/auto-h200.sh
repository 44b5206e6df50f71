#!/usr/bin/env bash
# The next device run for issue 20, as THEN= of run-h200.sh, in priority order within DEADLINE seconds
# (default 500) of this script's start:
#   NO_COMPARE=1 SIZE=1b OUT=$OUT THEN='bash tools/bench/device/auto-h200.sh' bash tools/bench/device/run-h200.sh
# 1. sdpa_decode_sweep.py: the decode attention kernels against MLX's composition over 256 shapes, folded
#    (one batch row, one KV head: MLX multiplies the query heads as one matrix) and not (log in $OUT).
# 2. qmv-decode.ts --ab ${AB:-sdpa} on the 12B-shaped model: MLX's kernels, the default less its decode
#    attention, the default (sdpa_decode "auto": where MLX does not fold), the kernels everywhere;
#    teacher-forced KL against the first (the default's must be 0) and tok/s with mlx-lm
#    (DECODE_REPS repetitions, default 3). Then the same on the 1B when time is left.
source "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"
DEADLINE="${DEADLINE:-500}"
REPS="${DECODE_REPS:-3}" TOKENS=128 KL_STEPS=16 QMV_DECODE_ARGS="--ab ${AB:-sdpa}" \
  DEADLINE=$(($(secs_left) - 10)) STEPS="${AUTO_STEPS:-sweep decode12b decode1b}" bash tools/kernels/qmv-h200.sh
echo "[auto-h200 +${SECONDS}s] done"
