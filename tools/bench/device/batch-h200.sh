#!/usr/bin/env bash
# Batched decode on a CUDA device, run as THEN= of run-h200.sh (which unpacks MLX's CUDA build and
# writes the 1B checkpoint):
#   NO_COMPARE=1 SIZE=1b OUT=$OUT THEN='bash tools/bench/device/batch-h200.sh' bash tools/bench/device/run-h200.sh
# Steps (STEPS, default all; each skipped when DEADLINE seconds would be passed):
#   fold      qmm-fold-check.py: MLX's quantized_matmul on [B, 1, K] against one [B, K] matrix, bit
#             equality on the 12B and 1B shapes and the time of each at B = 16
#   sched     batch-fold.ts on each of SCHED (default the 12B-shaped model, then the 1B): the
#             Scheduler's 16 streams with MLX_BUN_FAST_QMV off against auto (the fold), tokens equal and
#             aggregate tok/s
#   compare   compare.ts on the 12B-shaped model, 1 and 16 HTTP streams against mlx_lm.server, under
#             MLX_BUN_FAST_QMV=$COMPARE_QMV (default auto, the default: the fold from 8 rows; off: MLX's op)
source "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"
STEPS="${STEPS:-fold sched compare}"
DEADLINE="${DEADLINE:-520}"
log() { echo "[batch-h200 +${SECONDS}s] $*"; }

if step_on fold; then
  log "qmm-fold-check.py"
  timeout 150 "$PY" tools/bench/device/qmm-fold-check.py --json "$OUT/qmm-fold.json" 2>&1 | tee "$OUT/qmm-fold.log" | tail -40
fi
if { step_on sched || step_on compare; } && [ ! -f "$M12/config.json" ]; then
  log "writing the 12B-shaped checkpoint"
  "$PY" tools/bench/device/make_12b_model.py --out "$M12" --rng mlx 2>&1 | tail -1 || { log "checkpoint failed"; exit 1; }
fi
if step_on sched; then
  for m in ${SCHED:-$M12 $M1}; do
    [ "$(secs_left)" -lt 90 ] && { log "SKIP batch-fold $m ($(secs_left)s left)"; continue; }
    log "batch-fold.ts $m"
    timeout $(($(secs_left) - 10)) $B tools/bench/device/batch-fold.ts --model "$m" --streams "${STREAMS:-16}" --tokens "${TOKENS:-64}" \
      --reps "${REPS:-3}" --json "$OUT/batch-fold-$(basename "$m").json" 2>&1 | tail -6
  done
fi
if step_on compare; then
  [ "$(secs_left)" -lt 190 ] && { log "SKIP compare ($(secs_left)s left)"; exit 0; }
  log "compare.ts $M12 (1 and 16 streams)"
  MLX_BUN_FAST_QMV="${COMPARE_QMV:-auto}" timeout $(($(secs_left) - 5)) $B tools/bench/compare.ts --model "$M12" --label "${LABEL:-CUDA}, 12B-shaped" --python "$PY" \
    --streams 1,16 --stream-tokens 64 --stream-reps "${REPS:-3}" --reps "${REPS:-3}" --decode-tokens 128 \
    --skip "bandwidth,prefill,peak prefill,host work,roofline,kv,final peak" \
    --md "$OUT/compare-12b.md" --json "$OUT/compare-12b.json" 2>&1 | tail -22
fi
log "done"
