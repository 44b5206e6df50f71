#!/usr/bin/env bash
# Batch-1 decode of the 12B-shaped model under MLX's CUDA graph settings, each in its own processes
# (MLX reads them once per process), run as THEN= of run-h200.sh (which unpacks MLX's CUDA build):
#   NO_COMPARE=1 SIZE=mini OUT=$OUT THEN='bash tools/bench/device/graph-sweep.sh' bash tools/bench/device/run-h200.sh
# SETTINGS: space-separated VAR=VALUE[,VAR=VALUE] sets (default: mlx-bun's 60 kernels per graph, MLX's own
# default for the card, 200, and no CUDA graphs: every kernel launched directly). Per setting:
# decode-step-profile.ts --host (build / encode / wait per step, exact and exact-order matvec paths)
# and qmv-decode.ts --ab exact-qmv (KL, then tok/s of both paths and mlx-lm, same setting for all).
source "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"
SETTINGS="${SETTINGS:-MLX_MAX_OPS_PER_BUFFER=60 MLX_USE_CUDA_GRAPHS=0 MLX_MAX_OPS_PER_BUFFER=100 MLX_MAX_OPS_PER_BUFFER=200}"
DEADLINE="${DEADLINE:-540}"
log() { echo "[graph-sweep +${SECONDS}s] $*"; }
if [ ! -f "$M12/config.json" ]; then
  log "writing the 12B-shaped checkpoint"
  "$PY" tools/bench/device/make_12b_model.py --out "$M12" --rng mlx 2>&1 | tail -2 || { log "checkpoint failed"; exit 1; }
fi
for s in $SETTINGS; do
  [ $((DEADLINE - SECONDS)) -lt 100 ] && { log "SKIP $s (time)"; continue; }
  tag="${s//[=,]/_}"
  log "$s: host profile"
  env ${s//,/ } timeout 90 .native/bin/bun tools/bench/device/decode-step-profile.ts --model "$M12" --host --fast exact \
    --tokens "${HOST_TOKENS:-32}" --reps 2 2>&1 | tail -3 | tee "$OUT/host-$tag.log"
  log "$s: decode"
  env ${s//,/ } timeout 150 .native/bin/bun tools/bench/device/qmv-decode.ts --model "$M12" --python "$PY" --ab exact-qmv \
    --reps "${REPS:-3}" --decode-tokens "${TOKENS:-128}" --kl-steps "${KL_STEPS:-4}" --json "$OUT/decode-$tag.json" 2>&1 | tail -5
done
log "done"
