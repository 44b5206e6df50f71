#!/usr/bin/env bash
# Decode at batch 1 on the H200, piece by piece and against mlx-lm, under MLX's CUDA graph
# settings (run as THEN= of run-h200.sh, which has unpacked everything and written the 1B model):
#   NO_COMPARE=1 THEN='bash tools/bench/device/decode-sweep-h200.sh' OUT=$OUT bash tools/bench/device/run-h200.sh
# OPS="20 60" picks the MLX_MAX_OPS_PER_BUFFER values compared (MLX's default is 20).
# The JSON of each run is kept as docs/bench-results/h200-decode-sweep/ops<N>-run<R>.json (R: the next
# run index there; docs/benchmarks.md has the table).
set -uo pipefail
model=.native/bench-models/gemma4-1b-4bit
PY="${PY:-/opt/torch/.venv/bin/python3}"
OUT="${OUT:-/tmp/h200-out}"
log() { echo "[sweep +${SECONDS}s] $*"; }
log "profilers: $(command -v nsys ncu perf 2>/dev/null | tr '\n' ' ')"
log "decode-profile"
timeout 200 .native/bin/bun tools/bench/decode-profile.ts --model "$model" --tokens 64 --reps "${PROFILE_REPS:-3}"
for ops in ${OPS:-20 60}; do
  log "compare decode, MLX_MAX_OPS_PER_BUFFER=$ops"
  MLX_MAX_OPS_PER_BUFFER=$ops timeout 150 .native/bin/bun tools/bench/compare.ts --no-http \
    --skip "bandwidth,prefill,peak prefill,roofline,kv,scheduler,final peak" --reps "${REPS:-3}" --decode-tokens 256 \
    --model "$model" --python "$PY" --label "H200 decode, MLX_MAX_OPS_PER_BUFFER=$ops" \
    --md "$OUT/decode-ops$ops.md" --json "$OUT/decode-ops$ops.json" 2>&1 | grep -v '^\[compare\] rep'
done
log "done"
