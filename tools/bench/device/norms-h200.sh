#!/usr/bin/env bash
# The fused exact norms (packages/mlx-ops/src/kernels/norm-exact.ts) on a CUDA device, run as THEN=
# of run-h200.sh (which unpacks MLX's CUDA build):
#   NO_COMPARE=1 SIZE=mini OUT=$OUT THEN='bash tools/bench/device/norms-h200.sh' bash tools/bench/device/run-h200.sh
# Steps (STEPS, default all, each skipped when DEADLINE seconds would be passed):
#   check     check_cuda_kernels.py --only the four norm kernels and the exact-order matvec: NVRTC,
#             then bit equality with MLX's rms_norm / RoPE / add / multiply / quantized_matmul on the GPU
#   norms     qmv-decode.ts --ab exact-norms on the 12B-shaped model: teacher-forced KL and max
#             |Δ logprob| of MLX_BUN_EXACT_NORMS=on against MLX's norms, then tok/s of both and mlx-lm
#   all       the same with both exact kernels (norms and the exact-order matvec): --ab exact-all
#   ladder    qmv-decode.ts --ab exact-ladder (MLX's kernels, each exact kernel alone, both, mlx-lm;
#             REPS interleaved) on the 12B-shaped model, then on the 1B (M1); LADDER=exact-auto: MLX's
#             kernels against the default settings instead
#   ops       --ab exact-all under MLX_MAX_OPS_PER_BUFFER=N for each N in OPS (mlx-bun's own default: 60)
#   graphs    graph-sweep.sh over SETTINGS with what time is left
source "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"
STEPS="${STEPS:-check norms all graphs}"
DEADLINE="${DEADLINE:-480}"
log() { echo "[norms-h200 +${SECONDS}s] $*"; }

if step_on check; then
  $B tools/kernels/export-sources.ts /tmp/kernel-sources.json >/dev/null || exit 1
  log "check_cuda_kernels.py (norm kernels, exact-order matvec)"
  timeout 150 "$PY" tools/kernels/check_cuda_kernels.py /tmp/kernel-sources.json \
    --only mlxb_qkv_norm_exact,mlxb_q_norm_exact,mlxb_residual_norm_exact,mlxb_residual_exact,mlxb_qmv_exact 2>&1 | tee "$OUT/norms-check.log" | tail -32
fi
if { step_on norms || step_on all || step_on ladder || step_on ops || step_on graphs; } && [ ! -f "$M12/config.json" ]; then
  log "writing the 12B-shaped checkpoint"
  "$PY" tools/bench/device/make_12b_model.py --out "$M12" --rng mlx 2>&1 | tail -1 || { log "checkpoint failed"; exit 1; }
fi
for ab in norms all; do
  step_on "$ab" || continue
  [ "$(secs_left)" -lt 120 ] && { log "SKIP $ab ($(secs_left)s left)"; continue; }
  log "qmv-decode.ts --ab exact-$ab"
  timeout $(($(secs_left) - 20)) $B tools/bench/device/qmv-decode.ts --model "$M12" --python "$PY" --ab "exact-$ab" \
    --reps "${REPS:-3}" --decode-tokens "${TOKENS:-128}" --kl-steps "${KL_STEPS:-16}" --json "$OUT/exact-$ab-12b.json" 2>&1 | tail -8
done
if step_on ladder; then
  if [ ! -f "$M1/config.json" ]; then
    log "writing the 1B checkpoint"
    "$PY" tools/bench/make_bench_model.py --size 1b --out "$M1" --rng mlx 2>&1 | tail -1
  fi
  for m in "$M12" "$M1"; do
    [ "$(secs_left)" -lt 100 ] && { log "SKIP ladder $m ($(secs_left)s left)"; continue; }
    log "qmv-decode.ts --ab ${LADDER:-exact-ladder} $m"
    timeout $(($(secs_left) - 10)) $B tools/bench/device/qmv-decode.ts --model "$m" --python "$PY" --ab "${LADDER:-exact-ladder}" \
      --reps "${REPS:-5}" --decode-tokens "${TOKENS:-128}" --kl-steps "${KL_STEPS:-16}" --json "$OUT/${LADDER:-exact-ladder}-$(basename "$m").json" 2>&1 | tail -8
  done
fi
if step_on ops; then
  for n in ${OPS:-100 200}; do
    [ "$(secs_left)" -lt 80 ] && { log "SKIP ops $n ($(secs_left)s left)"; continue; }
    log "MLX_MAX_OPS_PER_BUFFER=$n qmv-decode.ts --ab exact-all"
    MLX_MAX_OPS_PER_BUFFER=$n timeout $(($(secs_left) - 10)) $B tools/bench/device/qmv-decode.ts --model "$M12" --python "$PY" --ab exact-all \
      --reps 3 --decode-tokens "${TOKENS:-128}" --kl-steps 2 --json "$OUT/exact-all-ops$n-12b.json" 2>&1 | tail -5
  done
fi
if step_on graphs && [ "$(secs_left)" -ge 120 ]; then
  DEADLINE=$(secs_left) SETTINGS="${SETTINGS:-MLX_USE_CUDA_GRAPHS=0 MLX_MAX_OPS_PER_BUFFER=200}" bash tools/bench/device/graph-sweep.sh
fi
log "done"
