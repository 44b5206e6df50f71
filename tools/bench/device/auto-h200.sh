#!/usr/bin/env bash
# The default on the 12B-shaped model and the candidates for the next one (the staged matvec, the
# split-K attention kernel), run as THEN= of run-h200.sh, in priority order within DEADLINE seconds
# (default 500) of this script's start (AB= another qmv-decode.ts --ab mode for step 1):
#   NO_COMPARE=1 SIZE=1b OUT=$OUT THEN='bash tools/bench/device/auto-h200.sh' bash tools/bench/device/run-h200.sh
# 1. qmv-decode.ts --ab candidates on the 12B-shaped model: MLX's kernels, the default (KL 0 expected),
#    the default with the staged matvec (KL 0 expected) and with the split-K attention kernel;
#    teacher-forced KL and tok/s with mlx-lm (DECODE_REPS repetitions, default 3).
# 2. bench_qmv.py --quick: µs per shape, the lm_head, 2 and 4 rows, 8-bit, 2/4/8 chunks in flight, staged.
# 3. batch-fold.ts on the 12B-shaped model: the Scheduler's 16 streams, off vs auto, tokens equal.
source "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"
DEADLINE="${DEADLINE:-500}"
REPS="${DECODE_REPS:-3}" TOKENS=128 KL_STEPS=8 QMV_DECODE_ARGS="--ab ${AB:-candidates}" \
  DEADLINE=$(($(secs_left) - 170)) STEPS=decode12b bash tools/kernels/qmv-h200.sh
[ "$(secs_left)" -gt 100 ] && QUICK=1 DEADLINE=$(($(secs_left) - 60)) STEPS=bench bash tools/kernels/qmv-h200.sh
[ "$(secs_left)" -gt 60 ] && STEPS=sched SCHED="$M12" REPS=2 DEADLINE=$(($(secs_left) - 10)) bash tools/bench/device/batch-h200.sh
echo "[auto-h200 +${SECONDS}s] done"
