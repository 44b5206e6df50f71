#!/usr/bin/env bash
# The decode-attention kernels on the H200, run as the THEN step of tools/bench/device/run-h200.sh
# (which unpacks MLX's CUDA build, Bun and libmlxb.so and exports LD_LIBRARY_PATH, MLX_BUN_NATIVE,
# MLX_BUN_PYTHON and MLX_PTX_CACHE_DIR; see docs/benchmarks.md for the two device calls):
#   NO_COMPARE=1 THEN='STEPS="check tests" bash tools/kernels/run-h200.sh' bash tools/bench/device/run-h200.sh
#   NO_COMPARE=1 THEN='STEPS=bench bash tools/kernels/run-h200.sh' bash tools/bench/device/run-h200.sh
# Steps (STEPS, default "check tests bench"; NVRTC compiles every template variant on first use,
# so one call may not hold all three):
#   check  every CUDA body through mx.fast.cuda_kernel against its reference (check_cuda_kernels.py)
#   tests  the kv-cache kernel tests, whose GPU cases run only where a backend is live (needs vitest
#          in the carried node_modules; skipped with a note otherwise)
#   bench  tools/bench/kv-cache.ts: fused kernels vs bf16 (fast SDPA and the split-K kernel) at 1k / 8k /
#          32k / 128k tokens (CONTEXTS; UNFUSED=1 adds the unfused path; LAYERS=N times N attends
#          per evaluation; SCALE=1 attends as Gemma 4 does, default 1/16), then at 16 / 8 heads of 512
#   profile Nsight Compute (ncu, full set) of the pass-1 and pass-2 kernels of PROFILE_MODES (default
#          turbo:4,3) at 131,072 tokens, 16 / 8 heads of 512 and 8 / 2 heads of 256: details and the
#          SASS with its stall samples as text (NCU=path of ncu; PROFILE_SHAPES="16,8 512;8,2 256" picks the shapes)
#   timeline every kernel's GPU time (ncu, one metric, clocks as in a run) over kv-cache.ts with TIMELINE_MODES
#          at 131,072 tokens, the shapes of PROFILE_SHAPES, 2 reps of LAYERS attends: where an attend's time goes
#          (tools/kernels/attend-timeline.py sums the last evaluation's kernels per mode)
# Everything goes to $OUT.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
OUT="${OUT:-/tmp/h200-out}"
PY="${MLX_BUN_PYTHON:-python3}"
STEPS="${STEPS:-check tests bench}"
mkdir -p "$OUT"
log() { echo "[kernels-h200 +${SECONDS}s] $*"; }
has() { [[ " $STEPS " == *" $1 "* ]]; }
if has check; then
  log "export sources, check_cuda_kernels.py"
  .native/bin/bun tools/kernels/export-sources.ts "$OUT/kernel-sources.json" || exit 1
  timeout "${CHECK_S:-420}" "$PY" tools/kernels/check_cuda_kernels.py "$OUT/kernel-sources.json" ${CHECK_ARGS:-} >"$OUT/check-cuda.log" 2>&1
  echo "check_cuda_kernels.py exit $?"
  grep -v "outside tolerance 0$" "$OUT/check-cuda.log" | tail -20
fi
if has tests; then
  log "kv-cache kernel tests"
  if [ -d node_modules/vitest ]; then
    (cd packages/kv-cache && timeout "${TESTS_S:-180}" ../../.native/bin/bun x --bun vitest run test/decode-kernels.test.ts test/kernels.test.ts) >"$OUT/vitest.log" 2>&1
    echo "vitest exit $?"
    tail -15 "$OUT/vitest.log"
  else
    echo "vitest is not in the carried node_modules: tests skipped" | tee "$OUT/vitest.log"
  fi
fi
if has bench; then
  log "kv-cache bench: 8 query / 2 KV heads of 256"
  timeout "${BENCH_S:-420}" .native/bin/bun tools/bench/kv-cache.ts --reps "${REPS:-7}" ${UNFUSED:+--unfused} ${LAYERS:+--layers "$LAYERS"} ${SCALE:+--scale "$SCALE"} \
    --contexts "${CONTEXTS:-1024,8192,32768,131072}" --json "$OUT/kv-cache-h200.json" 2>/dev/null | tee "$OUT/kv-cache-h200.md"
  # The 12B-shaped model's full-attention layers: 16 query / 8 KV heads of 512.
  log "kv-cache bench: 16 query / 8 KV heads of 512"
  timeout "${BENCH_S:-420}" .native/bin/bun tools/bench/kv-cache.ts --reps "${REPS:-7}" --heads 16,8 --dim 512 ${LAYERS:+--layers "$LAYERS"} ${SCALE:+--scale "$SCALE"} \
    --contexts "${CONTEXTS512:-32768,131072}" --json "$OUT/kv-cache-h200-d512.json" 2>/dev/null | tee "$OUT/kv-cache-h200-d512.md"
fi
# Run function $1 once per PROFILE_SHAPES entry ("Hq,Hkv D" pairs separated by ';') with HEADS, DIM, TAG set.
for_shapes() {
  local shape
  IFS=';' read -ra shapes <<<"${PROFILE_SHAPES:-16,8 512;8,2 256}"
  for shape in "${shapes[@]}"; do
    HEADS="${shape% *}" DIM="${shape#* }" TAG="h${shape%%,*}-d${shape#* }" "$1"
  done
}
NCU="${NCU:-/usr/local/cuda/bin/ncu}"
profile_shape() {
  log "ncu: ${PROFILE_MODES:-turbo:4,3} at 131072 tokens, heads $HEADS of $DIM"
  # Skip the first launches (compilation, the first rep); profile one launch of each kernel.
  timeout "${PROFILE_S:-240}" "$NCU" --set full --import-source no -k "regex:mlxb_.*decode" --launch-skip 2 --launch-count 2 \
    -o "$OUT/ncu-$TAG" -f .native/bin/bun tools/bench/kv-cache.ts --reps 3 --heads "$HEADS" --dim "$DIM" \
    --contexts 131072 --modes "${PROFILE_MODES:-turbo:4,3}" >"$OUT/ncu-$TAG.log" 2>&1
  echo "ncu exit $?"; tail -5 "$OUT/ncu-$TAG.log"
  "$NCU" -i "$OUT/ncu-$TAG.ncu-rep" --page details >"$OUT/ncu-$TAG-details.txt" 2>&1
  "$NCU" -i "$OUT/ncu-$TAG.ncu-rep" --page source --csv --print-source sass >"$OUT/ncu-$TAG-sass.csv" 2>&1
  grep -E "Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|Theoretical Occupancy|Waves Per SM" "$OUT/ncu-$TAG-details.txt" | head -30
  # What comes back from the device is limited in count: the report and the log stay there.
  rm -f "$OUT/ncu-$TAG.ncu-rep" "$OUT/ncu-$TAG.log"
}
timeline_shape() {
  log "ncu timeline: ${TIMELINE_MODES:-turbo:4,3} at 131072 tokens, heads $HEADS of $DIM"
  timeout "${PROFILE_S:-240}" "$NCU" --profile-from-start off --metrics gpu__time_duration.sum --clock-control none \
    --csv --print-kernel-base function .native/bin/bun tools/bench/kv-cache.ts --profile-last --reps 2 --layers "${LAYERS:-8}" ${SCALE:+--scale "$SCALE"} \
    --heads "$HEADS" --dim "$DIM" --contexts 131072 --modes "${TIMELINE_MODES:-turbo:4,3}" >"$OUT/timeline-$TAG.csv" 2>"$OUT/timeline-$TAG.err"
  echo "ncu exit $?"; tail -3 "$OUT/timeline-$TAG.err"
  "$PY" tools/kernels/attend-timeline.py "$OUT/timeline-$TAG.csv" "${LAYERS:-8}" "${TIMELINE_LABELS:-bf16;${TIMELINE_MODES:-turbo:4,3}}" | tee "$OUT/timeline-$TAG.md"
  xz -9 "$OUT/timeline-$TAG.csv"; rm -f "$OUT/timeline-$TAG.err"
}
has profile && for_shapes profile_shape
has timeline && for_shapes timeline_shape
log "done"
