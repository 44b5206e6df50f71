#!/usr/bin/env bash
# Long context end to end on the H200 (issue 24; tools/bench/long-context.ts): the 12B-shaped
# random 4-bit checkpoint (48 layers, sliding window 1,024, full layers holding the whole
# context), every KV mode and mlx-lm bf16 at 8k / 32k / 128k prompts. Run as THEN of
# run-h200.sh, which has unpacked MLX CUDA + Bun and exported LD_LIBRARY_PATH, MLX_BUN_NATIVE,
# MLX_BUN_PYTHON and MLX_PTX_CACHE_DIR (SIZE=mini keeps its own checkpoint step short):
#   NO_COMPARE=1 SIZE=mini THEN='bash tools/bench/device/long-context-h200.sh' OUT=$OUT bash tools/bench/device/run-h200.sh
# Environment: BUDGET (seconds this script may take, default 500: the device call is 600 s and
# run-h200.sh spends some before THEN), LC_ARGS (more long-context.ts options, e.g.
# "--lengths 131072 --modes bf16,turbo:4,3"), MODEL (default /tmp/m12full, written when absent).
# Outputs in $OUT: long-context.json (rewritten after every variant), long-context.md, long-context.log.
source "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"
PY="${MLX_BUN_PYTHON:-/opt/torch/.venv/bin/python3}"
MODEL="${MODEL:-/tmp/m12full}"
BUDGET="${BUDGET:-500}"
log() { echo "[long-context-h200 +${SECONDS}s] $*"; }
if [ -f "$MODEL/config.json" ]; then
  log "checkpoint $MODEL exists"
else
  log "writing the 12B-shaped checkpoint to $MODEL"
  "$PY" tools/bench/device/make_12b_model.py --out "$MODEL" --rng mlx || { log "checkpoint failed"; exit 1; }
fi
left=$((BUDGET - SECONDS))
# No variant starts in the last TAIL seconds (a 128k variant takes ~30-70 s); what ran is in the JSON.
deadline=$((left - ${TAIL:-70}))
log "long-context.ts: ${left}s left, deadline ${deadline}s; extra options: ${LC_ARGS:-none}"
# shellcheck disable=SC2086 # LC_ARGS is a list of options
timeout "$left" .native/bin/bun tools/bench/long-context.ts --model "$MODEL" --python "$PY" --deadline "$deadline" \
  --json "$OUT/long-context.json" --md "$OUT/long-context.md" ${LC_ARGS:-} 2>&1 | tee "$OUT/long-context.log"
log "done (rc ${PIPESTATUS[0]})"
nvidia-smi --query-gpu=name,memory.used,clocks.sm,temperature.gpu,power.draw --format=csv 2>/dev/null || true
