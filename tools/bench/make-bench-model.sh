#!/usr/bin/env bash
# The benchmark checkpoints (random weights, 4-bit) under .native/bench-models/ (git-ignored):
#   gemma4-1b-4bit    real size: 0.98B transformer + 0.40B embedding parameters read per token,
#                     vocab 262144, 1.5 GB on disk (about 2 minutes and 8 GB of RAM here)
#   gemma4-mini-4bit  the same architecture at CPU size (the 2-core CI machine's figures)
# Idempotent: a checkpoint is remade only when the maker scripts or the MLX/mlx-lm versions change.
#   bash tools/bench/make-bench-model.sh [1b|mini ...]     (default: both)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
py="${MLX_BUN_PYTHON:-.native/venv/bin/python}"
[ -x "$py" ] || { echo "make-bench-model: $py not found; run bash tools/setup.sh first" >&2; exit 1; }
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(1b mini)
versions="$("$py" -c 'import mlx.core as mx, mlx_lm; print(mx.__version__, mlx_lm.__version__)')"
for size in "${sizes[@]}"; do
  out=".native/bench-models/gemma4-$size-4bit"
  stamp="$(cat tools/bench/make_bench_model.py tools/make-tiny-model/make_tiny_model.py | sha256sum | cut -c1-16) $size seed0 $versions"
  if [ "$(cat "$out/.mlxb-stamp" 2>/dev/null || true)" = "$stamp" ]; then
    echo "[bench-model] $out is up to date"
    continue
  fi
  mkdir -p .native/bench-models
  "$py" tools/bench/make_bench_model.py --size "$size" --out "$out"
  echo "$stamp" > "$out/.mlxb-stamp"
done
