#!/usr/bin/env bash
# The second device call of the H200 comparison (docs/benchmarks.md says how it is run):
# unpack what tools/bench/device/pack.sh packed (call 1 left libmlx.xz.00 in /tmp/st), check
# MLX's CUDA backend from Python and from Bun, write the 1B checkpoint there (MLX's GPU RNG), and
# run tools/bench/compare.ts. Everything it writes for the report goes to $OUT.
#   bash tools/bench/device/run-h200.sh [compare.ts options]   (DEADLINE=seconds for the whole script, default 570)
# Dry run here (CPU, the mini model, a scratch site dir):
#   SITE=/tmp/site MLXLIB=.native/venv/lib/python3.11/site-packages/mlx/lib PY=.native/venv/bin/python SIZE=mini \
#     OUT=/tmp/out bash tools/bench/device/run-h200.sh --quick --no-http
source "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"
PY="${PY:-/opt/torch/.venv/bin/python3}"
SITE="${SITE:-$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')}"
MLXLIB="${MLXLIB:-$SITE/mlx/lib}"   # overrides only for a dry run on another machine
SIZE="${SIZE:-1b}"
log() { echo "[h200 +${SECONDS}s] $*"; }
log "python $("$PY" -V 2>&1), site $SITE, $(nproc) cores"
bash tools/bench/device/unpack.sh /tmp/st "$SITE" || { log "unpack failed"; exit 1; }
export LD_LIBRARY_PATH="$MLXLIB" MLX_BUN_NATIVE="$root/.native/device/libmlxb.so" MLX_BUN_PYTHON="$PY" PYTHONUNBUFFERED=1
# One on-disk PTX cache for every process of the run: MLX's CUDA backend JIT-compiles its kernels
# with NVRTC per process otherwise (a minute of warm-up each for the bench, each server, each check).
export MLX_PTX_CACHE_DIR="${MLX_PTX_CACHE_DIR:-/tmp/mlx-ptx-cache}"
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
"$PY" -c "import mlx.core as mx; print('python mlx', mx.__version__, mx.default_device(), (mx.ones(4) + 1).tolist())" || { log "MLX (CUDA) does not import"; exit 1; }
if ! .native/bin/bun tools/bench/device/smoke.ts; then
  log "the prebuilt libmlxb.so does not load; building it here"
  mkdir -p /tmp/mlxb-obj
  for f in packages/mlx-ffi/native/src/*.cpp; do
    g++ -std=c++20 -O3 -DNDEBUG -fPIC -fvisibility=hidden -Ipackages/mlx-ffi/native/include -I"$SITE/mlx/include" \
      -c "$f" -o "/tmp/mlxb-obj/$(basename "$f" .cpp).o" &
    while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do sleep 0.2; done
  done
  wait
  g++ -shared -o .native/device/libmlxb.so /tmp/mlxb-obj/*.o -L"$MLXLIB" -lmlx -Wl,-rpath,"$MLXLIB" || exit 1
  .native/bin/bun tools/bench/device/smoke.ts || { log "libmlxb.so does not load"; exit 1; }
fi
log "the $SIZE checkpoint"
model=".native/bench-models/gemma4-$SIZE-4bit"
[ -f "$model/config.json" ] || "$PY" tools/bench/make_bench_model.py --size "$SIZE" --out "$model" --rng mlx || { log "model failed"; exit 1; }
if [ -n "${CHECKS:-}" ]; then
  # Logits against mlx-lm on CUDA (tools/bench/device/logits-check.ts): tiny variants, then the 1B.
  for v in $CHECKS; do
    case "$v" in
      1b) d="$model" ;;
      *) d="/tmp/tiny-$v"; "$PY" tools/make-tiny-model/make_tiny_model.py --out "$d" --variant "${v%%-*}" $([ "${v#*-}" = 4bit ] && echo --quant 4bit) >/dev/null || continue ;;
    esac
    log "logits check $v"
    timeout 240 .native/bin/bun tools/bench/device/logits-check.ts --model "$d" --steps "${CHECK_STEPS:-24}" 2>&1 | tee -a "$OUT/logits-check.jsonl"
  done
fi
if [ -n "${THEN:-}" ]; then
  log "running: $THEN"
  bash -c "$THEN" 2>&1 | tee -a "$OUT/then.log"
fi
[ -n "${NO_COMPARE:-}" ] && { log "done (no compare)"; exit 0; }
left=$((${DEADLINE:-570} - SECONDS))
log "compare.ts (${left}s left)"
# Options given to this script come first: compare.ts takes the first occurrence of a flag.
timeout "$left" .native/bin/bun tools/bench/compare.ts "$@" --model "$model" --label "H200 (CUDA)" \
  --python "$PY" --decode-tokens 256 --stream-tokens 128 --prefill-reps 3 --bandwidth-mb 4096 \
  --md "$OUT/benchmarks-h200.md" --json "$OUT/compare-h200.json" 2>&1 | tee "$OUT/compare.log"
log "done (compare rc ${PIPESTATUS[0]})"
nvidia-smi --query-gpu=name,memory.used,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
