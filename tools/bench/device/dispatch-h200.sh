#!/usr/bin/env bash
# The checks of MLX 0.32.4's CUDA dispatch as read from its binary (docs/custom-kernels.md, "Batched
# rows and MLX's CUDA dispatch"), run as THEN= of run-h200.sh, in priority order within DEADLINE
# seconds (default 500) of this script's start:
#   NO_COMPARE=1 SIZE=1b OUT=$OUT THEN='bash tools/bench/device/dispatch-h200.sh' bash tools/bench/device/run-h200.sh
# 1. check_cuda_kernels.py --only mlxb_qmv_exact: the lm_head shapes, the whole 30,720-row stack, 8-bit and
#    2-7 rows against MLX's op, bit for bit.
# 2. qmm-fold-check.py: batched rows as [B, 1, K] and as one [B, K] matrix, bit for bit, and timed.
# 3. qmv-decode.ts --ab exact-qmv on the 1B: MLX's matvec vs MLX_BUN_FAST_QMV=exact (the wider
#    domain: lm_head, tall stacks), teacher-forced KL and tok/s with mlx-lm.
# 4. batch-fold.ts on the 1B: the Scheduler's 16 streams, off vs auto (the fold), tokens equal and tok/s.
# 5. bench_qmv.py --quick: µs per shape, MLX's op vs the exact-order kernel, the lm_head included.
source "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"
DEADLINE="${DEADLINE:-500}"
CHECK_ONLY=mlxb_qmv_exact DEADLINE=120 STEPS=check bash tools/kernels/qmv-h200.sh
STEPS=fold DEADLINE=160 bash tools/bench/device/batch-h200.sh
REPS=3 TOKENS=128 KL_STEPS=16 QMV_DECODE_ARGS="--ab exact-qmv" DEADLINE=$(($(secs_left) - 100)) STEPS=decode1b bash tools/kernels/qmv-h200.sh
[ "$(secs_left)" -gt 90 ] && STEPS=sched SCHED="$M1" REPS=2 DEADLINE=$(($(secs_left) - 60)) bash tools/bench/device/batch-h200.sh
[ "$(secs_left)" -gt 60 ] && QUICK=1 DEADLINE=$(secs_left) STEPS=bench bash tools/kernels/qmv-h200.sh
echo "[dispatch-h200 +${SECONDS}s] done"
