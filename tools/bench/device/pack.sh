#!/usr/bin/env bash
# Pack what tools/bench/compare.ts needs on the H200 device machine (no network, no Bun, no MLX)
# into .device-carry/ (git-ignored), in two parts that each fit one call's 64 MiB with the
# working tree:
#   p1/  the first 59 MB of libmlx.so (mlx-cuda-13 0.32.4) compressed with xz -9 (59 + the ~4.6 MB
#        working tree stays under the 64 MiB a call carries; 62 did not by 2026-12-06)
#   p2/  the rest of it; bun (xz); the Python site tree (mlx cp312 + mlx-cuda-13 minus libmlx.so +
#        mlx-lm, tar.xz); the node_modules subset of the runtime dependencies (tar.xz);
#        libmlxb.so built here against MLX 0.32.4's headers (identical in the CPU and CUDA wheels;
#        it finds libmlx.so through LD_LIBRARY_PATH there)
# Idempotent: what exists is reused (delete .device-carry/ to start over; p2's node_modules
# tarball and libmlxb.so are always remade). Usage: bash tools/bench/device/pack.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
cd "$root"
c=.device-carry
mkdir -p "$c/whl" "$c/p1" "$c/p2" "$c/stage"
grep -qx '/.device-carry/' .git/info/exclude 2>/dev/null || echo '/.device-carry/' >> .git/info/exclude
py=.native/venv/bin/python
MLX_V="$(python3 -c "import json;print(json.load(open('tools/setup/pins.json'))['mlx'])")"
MLXLM_V="$(python3 -c "import json;print(json.load(open('tools/setup/pins.json'))['mlx-lm'])")"
say() { printf '[pack] %s\n' "$*"; }

# 1. Wheels (cp312 for the device's Python 3.12).
if ! ls "$c"/whl/mlx_cuda_13-"$MLX_V"-*.whl >/dev/null 2>&1; then
  say "downloading mlx==$MLX_V (cp312), mlx-cuda-13==$MLX_V, mlx-lm==$MLXLM_V"
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    -d "$c/whl" "mlx==$MLX_V" "mlx-cuda-13==$MLX_V" "mlx-lm==$MLXLM_V"
fi
cuda_whl="$(ls "$c"/whl/mlx_cuda_13-"$MLX_V"-*.whl)"

# 2. libmlx.so, xz -9, split at 59 MB.
if [ ! -f "$c/stage/libmlx.so.xz" ]; then
  say "compressing libmlx.so (xz -9; a few minutes)"
  unzip -p "$cuda_whl" mlx/lib/libmlx.so | xz -9 -T0 > "$c/stage/libmlx.so.xz.tmp"
  mv "$c/stage/libmlx.so.xz.tmp" "$c/stage/libmlx.so.xz"
fi
rm -f "$c"/p1/libmlx.xz.* "$c"/p2/libmlx.xz.*
split -b 59000000 -d -a 2 "$c/stage/libmlx.so.xz" "$c/stage/libmlx.xz."
mv "$c/stage/libmlx.xz.00" "$c/p1/"
mv "$c"/stage/libmlx.xz.0[1-9] "$c/p2/"
unzip -p "$cuda_whl" mlx/lib/libmlx.so | sha256sum | cut -d' ' -f1 > "$c/p2/libmlx.so.sha256"

# 3. The Python site tree (everything of the three wheels but libmlx.so).
if [ ! -f "$c/p2/site.tar.xz" ]; then
  say "packing the Python site tree"
  s="$c/stage/site"
  rm -rf "$s" && mkdir -p "$s"
  for w in "$c"/whl/mlx-"$MLX_V"-cp312-*.whl "$c"/whl/mlx_lm-"$MLXLM_V"-*.whl; do unzip -q -o "$w" -d "$s"; done
  unzip -q -o "$cuda_whl" -x 'mlx/lib/libmlx.so' -d "$s"
  tar -C "$s" -cf - . | xz -9 -T0 > "$c/p2/site.tar.xz"
fi

# 4. Bun (the pinned binary the set-up installed).
if [ ! -f "$c/p2/bun.xz" ]; then
  say "compressing bun (xz -9)"
  xz -9 -T0 -c "$(readlink -f .native/bin/bun)" > "$c/p2/bun.xz.tmp" && mv "$c/p2/bun.xz.tmp" "$c/p2/bun.xz"
fi

# 5. node_modules: the runtime dependencies only (symlinks kept), as installed now.
# Without sharp's native libvips (6 MB compressed; the device benches are text-only, and
# models/src/vision loads sharp on first use): p2 must fit one call with the working tree.
python3 tools/bench/device/nm_subset.py . | grep -v '^node_modules/.bun/@img+sharp-' > "$c/stage/nm.txt"
tar -cf - -T "$c/stage/nm.txt" | xz -6 -T0 > "$c/p2/nm.tar.xz"

# 6. libmlxb.so from the current native sources, against the pinned MLX headers.
b="$c/stage/mlxb-build"
cmake -S packages/mlx-ffi/native -B "$b" -DCMAKE_BUILD_TYPE=Release \
  -DMLX_DIR="$("$py" -m mlx --cmake-dir)/share/cmake/MLX" >/dev/null
cmake --build "$b" --parallel "$(nproc)" >/dev/null
cp "$b/libmlxb.so" "$c/p2/libmlxb.so"

tree_bytes=$( { git ls-files; git ls-files --others --exclude-standard; } | sort -u | while read -r f; do [ -f "$f" ] && stat -c %s "$f"; done | awk '{s+=$1} END {print s+0}')
p1=$(du -cb "$c"/p1/* | tail -1 | cut -f1)
p2=$(du -cb "$c"/p2/* | tail -1 | cut -f1)
say "working tree $tree_bytes B; p1 $p1 B (+tree $((p1 + tree_bytes))); p2 $p2 B (+tree $((p2 + tree_bytes))); limit $((64 * 1024 * 1024))"
ls -la "$c/p1" "$c/p2"
