#!/usr/bin/env bash
# The next device run for issue 20, as THEN= of run-h200.sh, in priority order within DEADLINE seconds
# (default 500) of this script's start:
#   NO_COMPARE=1 SIZE=1b OUT=$OUT THEN='bash tools/bench/device/auto-h200.sh' bash tools/bench/device/run-h200.sh
# 1. The default (custom-kernel) path's graph build under Bun's profiler, 1B then 12B-shaped
#    (decode-step-profile.ts --host --only fast; Markdown summaries in $OUT/cpuprof-*): the ninth
#    session profiled MLX's kernels only (docs/benchmarks.md, "Per-op overhead against Python MLX").
# 2. qmv-decode.ts --ab ${AB:-exact-auto} on the 12B-shaped model and the 1B: MLX's kernels against the
#    default, KL (must be 0) and tok/s with mlx-lm (DECODE_REPS repetitions, default 3).
source "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"
DEADLINE="${DEADLINE:-500}"
NCU_FAST=auto HOST_PROF=100 HOST_TOKENS=32 HOST_REPS=1 DEADLINE=$(($(secs_left) / 2)) STEPS=host bash tools/kernels/qmv-h200.sh
REPS="${DECODE_REPS:-3}" TOKENS=128 KL_STEPS=16 QMV_DECODE_ARGS="--ab ${AB:-exact-auto}" \
  DEADLINE=$(($(secs_left) - 10)) STEPS="${AUTO_STEPS:-decode12b decode1b}" bash tools/kernels/qmv-h200.sh
echo "[auto-h200 +${SECONDS}s] done"
