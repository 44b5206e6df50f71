#!/usr/bin/env bash
# The THEN step of tools/bench/device/run-h200.sh (NO_COMPARE=1) for one device call that takes the
# figures a first call left out: compare.ts's HTTP and Scheduler phases (TTFT, HTTP overhead,
# concurrent streams), decode-profile.ts (mlx-bun's decode loop by phase), the tensor-parallel path
# with one rank (distributed-bench.ts; NCCL too where the wheel has it) and kv-cache.ts (fused
# decode kernels vs unfused). Each step has its own time limit; outputs go to $OUT.
#   NO_COMPARE=1 THEN='bash tools/bench/device/http-and-rest-h200.sh' bash tools/bench/device/run-h200.sh
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
cd "$root"
OUT="${OUT:-/tmp/h200-out}"
PY="${MLX_BUN_PYTHON:-python3}"
model=".native/bench-models/gemma4-${SIZE:-1b}-4bit"
log() { echo "[rest-h200 +${SECONDS}s] $*"; }
log "compare.ts: HTTP and Scheduler phases"
timeout "${COMPARE_S:-300}" .native/bin/bun tools/bench/compare.ts --skip "bandwidth,decode,prefill,peak prefill,host work,roofline,kv" \
  --model "$model" --label "H200 (CUDA), HTTP and Scheduler" --python "$PY" --ttft-reps 3 --stream-reps 1 --stream-tokens 64 \
  --kv-modes bf16 --md "$OUT/http-h200.md" --json "$OUT/http-h200.json" 2>&1 | tr '\r' '\n' | grep -v "rep [0-9]*/" | tail -40
log "decode-profile.ts"
timeout "${PROFILE_S:-50}" .native/bin/bun tools/bench/decode-profile.ts --model "$model" --tokens 32 --reps 1 2>&1 | tr '\r' '\n' | tail -11
log "distributed-bench.ts (one rank)"
timeout "${DIST_S:-70}" .native/bin/bun tools/bench/device/distributed-bench.ts --model "$model" 2>&1 | tail -8
if "$PY" -c "import mlx.core as mx, sys; sys.exit(0 if mx.distributed.is_available('nccl') else 1)"; then
  log "distributed-bench.ts under mlx-bun launch -n 1 --backend nccl"
  timeout "${NCCL_S:-60}" .native/bin/bun apps/mlx-bun/src/cli.ts launch -n 1 --backend nccl --timeout 50 -- \
    .native/bin/bun tools/bench/device/distributed-bench.ts --model "$model" 2>&1 | tail -8
else
  log "this MLX build has no NCCL backend"
fi
log "kv-cache.ts (fused decode kernels vs unfused)"
timeout "${KV_S:-30}" .native/bin/bun tools/bench/kv-cache.ts --reps 1 --contexts 1024,8192 --unfused 2>&1 | tail -16
log "done"
