#!/usr/bin/env bash
# Tensor-parallel code on one H200 (docs/distributed.md, GPU): the usual device set-up of
# run-h200.sh (unpack, libmlxb, the 1B checkpoint; NO_COMPARE), then distributed-bench.ts with one
# rank: first a plain size-1 group, then under `mlx-bun launch -n 1 --backend nccl` when the
# mlx-cuda wheel has NCCL (NCCL init with MLX_WORLD_SIZE=1). Output in $OUT/distributed.log.
#   bash tools/bench/device/distributed-h200.sh
source "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"
NO_COMPARE=1 bash tools/bench/device/run-h200.sh || exit 1
PY="${PY:-/opt/torch/.venv/bin/python3}"
SITE="${SITE:-$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')}"
export LD_LIBRARY_PATH="${MLXLIB:-$SITE/mlx/lib}" MLX_BUN_NATIVE="$root/.native/device/libmlxb.so" MLX_PTX_CACHE_DIR="${MLX_PTX_CACHE_DIR:-/tmp/mlx-ptx-cache}"
model=".native/bench-models/gemma4-${SIZE:-1b}-4bit"
"$PY" -c "import mlx.core as mx; print('python: nccl', mx.distributed.is_available('nccl'), 'ring', mx.distributed.is_available('ring'))" | tee "$OUT/distributed.log"
timeout 200 .native/bin/bun tools/bench/device/distributed-bench.ts --model "$model" 2>&1 | tee -a "$OUT/distributed.log"
if "$PY" -c "import mlx.core as mx, sys; sys.exit(0 if mx.distributed.is_available('nccl') else 1)"; then
  timeout 200 .native/bin/bun apps/mlx-bun/src/cli.ts launch -n 1 --backend nccl --timeout 120 -- \
    .native/bin/bun tools/bench/device/distributed-bench.ts --model "$model" 2>&1 | tee -a "$OUT/distributed.log"
fi
