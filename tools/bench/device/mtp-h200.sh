#!/usr/bin/env bash
# Gemma 4 MTP drafters on the H200 (issue 21): tools/bench/mtp.ts (plain vs a random and an echo
# MTP drafter, interleaved, greedy tokens checked equal) on the 1B bench target and on the
# 12B-shaped one. Run as the THEN step of tools/bench/device/run-h200.sh (which unpacks MLX's CUDA
# build, Bun and libmlxb.so, exports LD_LIBRARY_PATH, MLX_BUN_NATIVE, MLX_BUN_PYTHON,
# MLX_PTX_CACHE_DIR and writes the 1B checkpoint):
#   NO_COMPARE=1 THEN='DEADLINE=300 bash tools/bench/device/mtp-h200.sh' bash tools/bench/device/run-h200.sh
# (docs/benchmarks.md, "Gemma 4 MTP drafters on the CPU (issue 21)", "On the H200")
# The drafters are written by tools/make-tiny-model/make_tiny_drafter.py with the device python
# (mlx + mlx-lm, no mlx-vlm: it writes the same tensors with plain MLX then), bfloat16, shaped by
# mtp.ts's defaults for big targets (4 layers, hidden = target / 4, half the target's heads).
# The 12B-shaped checkpoint (tools/bench/device/make_12b_model.py) is written after the 1B bench
# (not beside it: drawing its weights on the GPU would skew the 1B timings); the 12B is skipped,
# and the log says so, when less than MIN12 (150) seconds are left before DEADLINE (seconds from
# this script's start) before its checkpoint, or MIN12_BENCH (80) before its bench. Expected on an
# H200: ~60 s for the 1B (drafters written, target loaded, 4 x 3 runs of 128 tokens), 30-60 s for
# the 12B checkpoint, ~90 s for the 12B: ~240 s. Files in $OUT: mtp-1b.json, mtp-12b.json,
# mtp-h200.log.
# Overrides for a dry run on the CPU: MODEL_1B, MODEL_12B, MAKE12_ARGS, REPS, TOKENS, PROMPT,
# MTP_ARGS (more mtp.ts options), e.g.
#   MLX_BUN_PYTHON=.native/venv/bin/python OUT=/tmp/mtp-out MODEL_1B=.native/bench-models/gemma4-mini-4bit \
#     MODEL_12B=/tmp/m12-tiny MAKE12_ARGS="--hidden 256 --layers 6 --mlp 512 --vocab 4096" REPS=1 TOKENS=16 \
#     bash tools/bench/device/mtp-h200.sh
source "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"
exec > >(tee -a "$OUT/mtp-h200.log") 2>&1
export MLX_BUN_PYTHON="$PY"
DEADLINE="${DEADLINE:-300}"
MIN12="${MIN12:-150}"        # left before the 12B checkpoint is written (write ~30-60 s + bench)
MIN12_BENCH="${MIN12_BENCH:-80}"  # left before the 12B bench itself
REPS="${REPS:-3}"
TOKENS="${TOKENS:-128}"
PROMPT="${PROMPT:-64}"
B=.native/bin/bun
M1="${MODEL_1B:-.native/bench-models/gemma4-1b-4bit}"
M12="${MODEL_12B:-.native/bench-models/gemma4-12b-4bit}"
log() { echo "[mtp-h200 +${SECONDS}s] $*"; }
left() { local l=$((DEADLINE - SECONDS - 5)); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
log "python $PY, deadline ${DEADLINE}s, reps $REPS, decode $TOKENS, prompt $PROMPT"
"$PY" -c "import mlx.core as mx, numpy; print('mlx', mx.__version__, mx.default_device())" || { log "the python has no mlx"; exit 1; }

bench() { # NAME MODEL
  local name=$1 m=$2
  log "$name: mtp.ts --target $m"
  # shellcheck disable=SC2086
  timeout "$(left 300)" $B tools/bench/mtp.ts --target "$m" --reps "$REPS" --decode-tokens "$TOKENS" --prompt-tokens "$PROMPT" \
    --label "H200 $name" --json "$OUT/mtp-$name.json" ${MTP_ARGS:-}
  log "$name: exit $?"
}

if [ -f "$M1/config.json" ]; then
  bench 1b "$M1"
else
  log "SKIP 1b: no checkpoint at $M1 (run-h200.sh writes it)"
fi

need12=$MIN12
[ -f "$M12/config.json" ] && need12=$MIN12_BENCH
if [ $((DEADLINE - SECONDS)) -lt "$need12" ]; then
  log "SKIP 12b: $((DEADLINE - SECONDS))s left before the deadline, needs ${need12}s"
else
  if [ ! -f "$M12/config.json" ]; then
    # After the 1B bench, not beside it: drawing 12B random weights on the GPU would skew its timings.
    log "writing the 12B-shaped checkpoint: $M12 ${MAKE12_ARGS:-}"
    # shellcheck disable=SC2086
    timeout "$(left 200)" "$PY" tools/bench/device/make_12b_model.py --out "$M12" --rng mlx ${MAKE12_ARGS:-} 2>&1 | tail -3
  fi
  if [ ! -f "$M12/config.json" ]; then
    log "SKIP 12b: no checkpoint at $M12"
  elif [ $((DEADLINE - SECONDS)) -lt "$MIN12_BENCH" ]; then
    log "SKIP 12b bench: $((DEADLINE - SECONDS))s left before the deadline, needs ${MIN12_BENCH}s"
  else
    bench 12b "$M12"
  fi
fi
log "done; $(ls "$OUT"/mtp-*.json 2>/dev/null | tr '\n' ' ')"
