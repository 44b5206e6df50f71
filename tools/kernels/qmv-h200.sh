#!/usr/bin/env bash
# The quantized matvec kernel and the decode profile on the H200, run as the THEN step of
# tools/bench/device/run-h200.sh (which unpacks MLX's CUDA build, Bun and libmlxb.so, exports
# LD_LIBRARY_PATH, MLX_BUN_NATIVE, MLX_BUN_PYTHON, MLX_PTX_CACHE_DIR and writes the 1B model):
#   NO_COMPARE=1 THEN='DEADLINE=515 STEPS="check bench ncu12b ncu1b host" bash tools/kernels/qmv-h200.sh' bash tools/bench/device/run-h200.sh
# (docs/benchmarks.md, "GPU decode at the memory bandwidth", has the runs made with it)
# Steps (STEPS; each is skipped when less than its budget is left before DEADLINE, in seconds
# from this script's own start: run-h200.sh spends ~30 s before it):
#   check    check_cuda_kernels.py --only ${CHECK_ONLY:-mlxb_qmv} (NVRTC + every case against the reference)
#   sweep    sdpa_decode_sweep.py: the decode attention kernels against MLX's composition over 256 shapes
#   encode   tools/bench/device/launch-encode.ts: MLX's encode per op kind of a 12B step (µs a call)
#   pvfold   tools/bench/device/pv-fold-check.py: MLX's decode sdpa against its composition with p·v folded (bits)
#   direct   tools/bench/device/direct-launch-check.ts: direct launches against MLX's CustomKernel path (bits)
#   graph    tools/bench/decode-graph.ts --all on the 12B-shaped model: op nodes a step per primitive, mlx-bun and mlx-lm
#   bench    tools/kernels/bench_qmv.py [--sweep with SWEEP=1]: µs and GB/s per shape, ours vs MLX
#   ncubench the same under ncu (kernel time, DRAM bytes, L2 flushed before each launch)
#   ncu12b / ncu1b   one decode step per path under ncu (tools/bench/device/decode-step-profile.ts --ncu;
#                    NCU_FAST=auto: MLX's kernels against the defaults, else MLX's op against the qmv kernel)
#   host     decode-step-profile.ts --host for the 1B and the 12B (build / encode / wait per step; NCU_FAST as for ncu12b;
#            HOST_PROF=µs: one path, HOST_ONLY (default fast), under Bun's profiler at that interval, Markdown in $OUT;
#            HOST_S: seconds a model may take, default 120, 300 under the profiler)
#   decode12b / decode1b   tools/bench/device/qmv-decode.ts: KL + tok/s exact / fast / mlx-lm (REPS, default 5;
#                          QMV_DECODE_ARGS="--ab fused" compares fused projections off / on instead)
# The 12B-shaped checkpoint (tools/bench/device/make_12b_model.py) is written in the background at
# the start when a step needs it. Files in $OUT: main.log (this script's output) and the ncu CSVs.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
OUT="${OUT:-/tmp/h200-out}"
PY="${MLX_BUN_PYTHON:-python3}"
NCU="${NCU:-/usr/local/cuda/bin/ncu}"
STEPS="${STEPS:-check bench ncu12b ncu1b host}"
DEADLINE="${DEADLINE:-560}"
B=.native/bin/bun
M1="${M1:-.native/bench-models/gemma4-1b-4bit}"
M12="${M12:-.native/bench-models/gemma4-12b-4bit}"  # M12=/tmp/m12full reuses long-context-h200.sh's checkpoint
mkdir -p "$OUT"
log() { echo "[qmv-h200 +${SECONDS}s] $*"; }
has() { [[ " $STEPS " == *" $1 "* ]]; }
# fits BUDGET: true when BUDGET seconds are left before DEADLINE (else logs a skip).
fits() { if [ $((DEADLINE - SECONDS)) -ge "$1" ]; then return 0; fi; log "SKIP ($((DEADLINE - SECONDS))s left, needs $1s)"; return 1; }
left() { local l=$((DEADLINE - SECONDS - 5)); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }

$B tools/kernels/export-sources.ts /tmp/kernel-sources.json || exit 1
if [[ "$STEPS" == *12b* || " $STEPS " == *" host "* ]] && [ ! -f "$M12/config.json" ]; then
  log "writing the 12B-shaped checkpoint in the background"
  ( "$PY" tools/bench/device/make_12b_model.py --out "$M12" --rng mlx > /tmp/make12b.log 2>&1; echo "exit $?" >> /tmp/make12b.log ) &
  MAKE12=$!
fi
wait12() {
  if [ -n "${MAKE12:-}" ]; then wait "$MAKE12"; MAKE12=; log "12B checkpoint: $(tail -2 /tmp/make12b.log | tr '\n' ' ')"; fi
  [ -f "$M12/config.json" ]
}
NCU_STEP=(--profile-from-start off --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
  --clock-control none --cache-control none --print-kernel-base function --csv)

for s in $STEPS; do
  case "$s" in
    check)
      fits 60 || continue
      log "check_cuda_kernels.py --only ${CHECK_ONLY:-mlxb_qmv}"
      timeout "$(left "${CHECK_S:-170}")" "$PY" tools/kernels/check_cuda_kernels.py /tmp/kernel-sources.json --only "${CHECK_ONLY:-mlxb_qmv}" 2>&1 | tail -40
      ;;
    sweep)
      fits 60 || continue
      log "sdpa_decode_sweep.py"
      (cd tools/kernels && timeout "$(left 150)" "$PY" sdpa_decode_sweep.py /tmp/kernel-sources.json 2>&1 | tee "$OUT/sdpa-decode-sweep.log" | tail -3)
      ;;
    encode)
      fits 60 || continue
      log "launch-encode.ts"
      timeout "$(left 120)" $B tools/bench/device/launch-encode.ts --calls 400 --reps 5 2>&1 | tee "$OUT/launch-encode.md" | tail -16
      ;;
    pvfold)
      fits 30 || continue
      log "pv-fold-check.py (MLX's sdpa against its composition with p·v folded: bits)"
      timeout "$(left 90)" "$PY" tools/bench/device/pv-fold-check.py > "$OUT/pv-fold.log" 2>&1
      grep -c equal "$OUT/pv-fold.log"; grep -i "differ\|error\|PASS\|FAIL" "$OUT/pv-fold.log" | head -24
      ;;
    direct)
      fits 40 || continue
      log "direct-launch-check.ts (direct launches against MLX's CustomKernel path: bits)"
      # decode12b/decode1b fall back to QMV_DECODE_ARGS_NO_DIRECT (when set) unless this passes.
      timeout "$(left 120)" $B tools/bench/device/direct-launch-check.ts > "$OUT/direct-check.log" 2>&1 && touch "$OUT/direct-ok"
      tail -12 "$OUT/direct-check.log"
      ;;
    graph)
      fits 100 || continue
      wait12 || { log "no 12B checkpoint"; continue; }
      log "decode-graph.ts --all (12B-shaped, one step's op nodes per primitive, mlx-bun's default and mlx-lm)"
      # The oracle wants a path to Python (MLX_BUN_PYTHON may be a bare command here).
      MLX_BUN_PYTHON="$(command -v "$PY")" timeout "$(left 150)" $B tools/bench/decode-graph.ts --model "$M12" --all --out "$OUT/graph12b" 2>&1 | tail -60
      xz -9 "$OUT"/graph12b/*.dot 2>/dev/null
      ;;
    bench)
      fits 60 || continue
      wait12 >/dev/null  # not while the 12B checkpoint is drawn on the same GPU
      log "bench_qmv.py ${SWEEP:+--sweep}"
      timeout "$(left 150)" "$PY" tools/kernels/bench_qmv.py /tmp/kernel-sources.json ${SWEEP:+--sweep} ${QUICK:+--quick} 2>&1
      ;;
    ncubench)
      fits 45 || continue
      log "bench_qmv.py --ncu under ncu"
      timeout "$(left 120)" "$NCU" --kernel-name regex:qmv --clock-control none --print-kernel-base function --csv \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size \
        "$PY" tools/kernels/bench_qmv.py /tmp/kernel-sources.json --ncu --quick > "$OUT/ncu-qmv.csv" 2>&1
      log "ncu exit $?, $(grep -c '"gpu__time_duration.sum"' "$OUT/ncu-qmv.csv") kernels"
      ;;
    ncu12b | ncu1b)
      fits 70 || continue
      m=$M1
      if [ "$s" = ncu12b ]; then wait12 || { log "no 12B checkpoint"; continue; }; m=$M12; fi
      log "$s: decode-step-profile.ts --ncu"
      timeout "$(left 200)" "$NCU" "${NCU_STEP[@]}" $B tools/bench/device/decode-step-profile.ts --model "$m" --ncu ${NCU_FAST:+--fast $NCU_FAST} > "/tmp/$s.csv" 2> "/tmp/$s.err"
      log "ncu exit $?, $(grep -c '"gpu__time_duration.sum"' "/tmp/$s.csv") kernels; $(grep -v '^==PROF==' "/tmp/$s.err" | tail -4 | tr '\n' ' ')"
      xz -T0 -c "/tmp/$s.csv" > "$OUT/$s.csv.xz"
      ;;
    host)
      for m in "$M1" "$M12"; do
        fits 50 || continue
        [ "$m" = "$M12" ] && { wait12 || continue; }
        log "decode-step-profile.ts --host $m"
        # HOST_PROF=µs: one path (HOST_ONLY, default fast) under Bun's sampling profiler, its Markdown summary in $OUT.
        # Under the profiler the first fast run (NVRTC compiles, a cold PTX cache) took over 120 s (ninth session).
        prof=() host_s=${HOST_S:-120}
        if [ -n "${HOST_PROF:-}" ]; then
          prof=(--cpu-prof --cpu-prof-md --cpu-prof-interval="$HOST_PROF" --cpu-prof-dir="$OUT/cpuprof-$(basename "$m")-${HOST_ONLY:-fast}")
          host_s=${HOST_S:-300}
        fi
        timeout "$(left "$host_s")" $B "${prof[@]}" tools/bench/device/decode-step-profile.ts --model "$m" --host --tokens "${HOST_TOKENS:-48}" --reps "${HOST_REPS:-2}" \
          ${NCU_FAST:+--fast $NCU_FAST} ${HOST_PROF:+--only ${HOST_ONLY:-fast}} 2>&1 | tail -3
      done
      ;;
    decode12b | decode1b)
      fits 90 || continue
      m=$M1
      if [ "$s" = decode12b ]; then wait12 || { log "no 12B checkpoint"; continue; }; m=$M12; fi
      log "$s: qmv-decode.ts"
      ab_args="${QMV_DECODE_ARGS:-}"
      if [ -n "${QMV_DECODE_ARGS_NO_DIRECT:-}" ] && [ ! -f "$OUT/direct-ok" ]; then ab_args="$QMV_DECODE_ARGS_NO_DIRECT"; log "(direct launches unchecked or failed: $ab_args)"; fi
      timeout "$(left 300)" $B tools/bench/device/qmv-decode.ts --model "$m" --python "$PY" --reps "${REPS:-5}" \
        --decode-tokens "${TOKENS:-256}" --kl-steps "${KL_STEPS:-64}" $ab_args --json "$OUT/$s.json" 2>&1 | tail -14
      ;;
    *) log "unknown step $s" ;;
  esac
done
[ -n "${MAKE12:-}" ] && kill "$MAKE12" 2>/dev/null
log "done"
