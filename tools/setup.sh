#!/usr/bin/env bash
# One idempotent set-up: Bun (from npm), the JS workspace, the pinned MLX wheels in a
# project-local venv, and the native C ABI library built against that MLX.
# A second run only checks stamps and lets CMake see nothing changed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
native="$root/.native"
mkdir -p "$native/bin"

pin() { python3 -c "import json,sys;print(json.load(open('tools/setup/pins.json'))[sys.argv[1]])" "$1"; }
BUN_V="$(pin bun)"; MLX_V="$(pin mlx)"; MLXLM_V="$(pin mlx-lm)"; OPENAI_V="$(pin openai-python)"
MLXVLM_V="$(pin mlx-vlm)"; REQUESTS_V="$(pin requests)"; PILLOW_V="$(pin pillow)"
step() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

# 1. Bun, from the npm registry, into .native/bun.
if [ "$("$native/bin/bun" --version 2>/dev/null || true)" != "$BUN_V" ]; then
  step "installing bun@$BUN_V from npm"
  npm install --no-audit --no-fund --silent --prefix "$native/bun" "bun@$BUN_V"
  ln -sf "$native/bun/node_modules/.bin/bun" "$native/bin/bun"
  ln -sf "$native/bun/node_modules/.bin/bun" "$native/bin/bunx"
fi
export PATH="$native/bin:$PATH"

# 2. JS dependencies.
deps_sum() { { cat package.json packages/*/package.json apps/*/package.json bun.lock 2>/dev/null || true; } | sha256sum | cut -c1-16; }
if [ "$(cat node_modules/.mlxb-stamp 2>/dev/null || true)" != "$(deps_sum)" ]; then
  step "bun install"
  if [ -f bun.lock ] && [ "${CI:-}" = "true" ]; then bun install --frozen-lockfile; else bun install; fi
  deps_sum > node_modules/.mlxb-stamp
fi

# 3. MLX wheels (shared library + headers; Python only for tests and tools).
backend="${MLX_BUN_BACKEND:-cpu}"   # cpu | cuda (mlx-cuda-13) | metal (macOS: Homebrew mlx for the build)
case "$(uname -s)/$backend" in
  Darwin/*) wheels="mlx==$MLX_V mlx-lm==$MLXLM_V" ;;
  */cuda)   wheels="mlx==$MLX_V mlx-cuda-13==$MLX_V mlx-lm==$MLXLM_V" ;;
  *)        wheels="mlx==$MLX_V mlx-cpu==$MLX_V mlx-lm==$MLXLM_V" ;;
esac
# The official OpenAI Python client, for the server tests.
wheels="$wheels openai==$OPENAI_V"
venv="$native/venv"
if [ "$(cat "$venv/.mlxb-stamp" 2>/dev/null || true)" != "$wheels" ]; then
  step "installing $wheels into .native/venv"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check $wheels
  echo "$wheels" > "$venv/.mlxb-stamp"
fi
# mlx-vlm, the reference for gemma4_unified, images and MTP drafters: without its dependencies (a
# server, audio and training stacks the tests never import), plus the two its model modules need.
vlm="mlx-vlm==$MLXVLM_V requests==$REQUESTS_V pillow==$PILLOW_V"
if [ "$(cat "$venv/.mlxb-vlm-stamp" 2>/dev/null || true)" != "$vlm" ]; then
  step "installing $vlm into .native/venv (mlx-vlm without its dependencies)"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "requests==$REQUESTS_V" "pillow==$PILLOW_V"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps "mlx-vlm==$MLXVLM_V"
  echo "$vlm" > "$venv/.mlxb-vlm-stamp"
fi

# 4. The native library (packages/mlx-ffi/native), against that MLX.
if [ "$(uname -s)" = "Darwin" ]; then
  mlx_dir="$(brew --prefix mlx)/share/cmake/MLX"
else
  mlx_dir="$("$venv/bin/python" -m mlx --cmake-dir)/share/cmake/MLX"
fi
build="packages/mlx-ffi/native/build"
if ! grep -qsE "^MLX_DIR:[A-Z]+=$mlx_dir\$" "$build/CMakeCache.txt"; then
  step "configuring native build against $mlx_dir"
  cmake -S packages/mlx-ffi/native -B "$build" -DCMAKE_BUILD_TYPE=Release -DMLX_DIR="$mlx_dir" >/dev/null
fi
step "building packages/mlx-ffi/native"
cmake --build "$build" --parallel "$(nproc 2>/dev/null || sysctl -n hw.ncpu)" 2>&1 | grep -v "^ninja: no work\|Built target\|Consolidate\|^\[" || true
test -f "$build/libmlxb.so" -o -f "$build/libmlxb.dylib"
# 5. The bundled tiny model: mlx-bun's default --model (apps/mlx-bun), remade only when the maker
#    script, its arguments or the wheels change.
tiny="$native/models/tiny-gemma4"
tiny_args="--variant small --seed 0"
tiny_stamp="$(sha256sum tools/make-tiny-model/make_tiny_model.py | cut -c1-16) $tiny_args $wheels"
if [ "$(cat "$tiny/.mlxb-stamp" 2>/dev/null || true)" != "$tiny_stamp" ]; then
  step "making the bundled tiny model in .native/models/tiny-gemma4"
  rm -rf "$tiny.tmp"
  mkdir -p "$native/models"
  "$venv/bin/python" tools/make-tiny-model/make_tiny_model.py $tiny_args --out "$tiny.tmp" >/dev/null
  echo "$tiny_stamp" > "$tiny.tmp/.mlxb-stamp"
  rm -rf "$tiny" && mv "$tiny.tmp" "$tiny"
fi
# 6. The web chat of mlx-bun serve (apps/mlx-bun/web → web/dist, git-ignored; Bun.build, no
#    network), rebuilt when its sources or the lockfile change.
web="apps/mlx-bun/web"
web_stamp="$( { find "$web" -path "$web/dist" -prune -o -type f -print | LC_ALL=C sort | xargs cat; cat bun.lock; } | sha256sum | cut -c1-16)"
if [ "$(cat "$native/web-chat.stamp" 2>/dev/null || true)" != "$web_stamp" ] || [ ! -f "$web/dist/index.html" ]; then
  step "building the web chat into $web/dist"
  bun "$web/build.ts" >/dev/null
  echo "$web_stamp" > "$native/web-chat.stamp"
fi
step "ready (bun $(bun --version), mlx $MLX_V, backend $backend)"
