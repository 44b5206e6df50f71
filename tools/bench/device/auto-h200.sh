#!/usr/bin/env bash
# The default (MLX_BUN_FAST_QMV=auto) once it took the wider exact domain and the batched-rows fold
# (docs/custom-kernels.md, "Batched rows and MLX's CUDA dispatch"), run as THEN= of run-h200.sh,
# in priority order within DEADLINE seconds (default 500) of this script's start:
#   NO_COMPARE=1 SIZE=1b OUT=$OUT THEN='bash tools/bench/device/auto-h200.sh' bash tools/bench/device/run-h200.sh
# 1. qmv-decode.ts --ab exact-auto on the 12B-shaped model: MLX's kernels vs the default,
#    teacher-forced KL and tok/s with mlx-lm (DECODE_REPS repetitions, default 3).
# 2. batch-fold.ts on the 12B-shaped model: the Scheduler's 16 streams, off vs auto, tokens equal.
# 3. bench_qmv.py --quick: µs per shape, the lm_head, 2 and 4 rows, 8-bit, 2/4/8 chunks in flight.
source "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"
DEADLINE="${DEADLINE:-500}"
REPS="${DECODE_REPS:-3}" TOKENS=128 KL_STEPS=8 QMV_DECODE_ARGS="--ab exact-auto" \
  DEADLINE=$(($(secs_left) - 170)) STEPS=decode12b bash tools/kernels/qmv-h200.sh
[ "$(secs_left)" -gt 100 ] && STEPS=sched SCHED="$M12" REPS=2 DEADLINE=$(($(secs_left) - 50)) bash tools/bench/device/batch-h200.sh
[ "$(secs_left)" -gt 45 ] && QUICK=1 DEADLINE=$(secs_left) STEPS=bench bash tools/kernels/qmv-h200.sh
echo "[auto-h200 +${SECONDS}s] done"
