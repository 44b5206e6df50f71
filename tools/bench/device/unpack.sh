#!/usr/bin/env bash
# On the device machine (or here, to test): install what tools/bench/device/pack.sh packed.
#   bash tools/bench/device/unpack.sh STASH SITE
# STASH holds libmlx.xz.00 (from call 1); .device-carry/p2 came with this call. SITE is the
# Python site-packages to install into (the device: /opt/torch/.venv/lib/python3.12/site-packages,
# where libmlx.so's rpath finds the CUDA libraries under nvidia/). Puts bun in .native/bin,
# node_modules in place, libmlxb.so in .native/device/. Prints the seconds each step took.
set -euo pipefail
stash="$1"
site="$2"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
cd "$root"
p2=.device-carry/p2
t=$(date +%s%N)
lap() { local n; n=$(date +%s%N); printf '[unpack] %-28s %6d ms\n' "$1" $(((n - t) / 1000000)); t=$n; }
# A warm machine (a call right after the last one) keeps what that call installed: nothing to do.
# A call without the carry has no p2: the checksum recorded beside libmlx.so at install stands in.
sum="$p2/libmlx.so.sha256"
[ -f "$sum" ] || sum="$site/mlx/lib/libmlx.so.sha256"
if [ -x .native/bin/bun ] && [ -f .native/device/libmlxb.so ] &&
  echo "$(cat "$sum" 2>/dev/null)  $site/mlx/lib/libmlx.so" | sha256sum -c --quiet >/dev/null 2>&1; then
  echo "[unpack] already installed (a warm machine)"
  exit 0
fi
mkdir -p "$site" .native/bin .native/device
tar -C "$site" -xJf "$p2/site.tar.xz"
lap "site tree"
cat "$stash"/libmlx.xz.00 "$p2"/libmlx.xz.0[1-9] | xz -d -T0 > "$site/mlx/lib/libmlx.so"
echo "$(cat "$p2/libmlx.so.sha256")  $site/mlx/lib/libmlx.so" | sha256sum -c --quiet
cp "$p2/libmlx.so.sha256" "$site/mlx/lib/libmlx.so.sha256"
lap "libmlx.so (sha256 ok)"
xz -d -T0 -c "$p2/bun.xz" > .native/bin/bun.new && chmod +x .native/bin/bun.new && mv -f .native/bin/bun.new .native/bin/bun
lap "bun $(.native/bin/bun --version)"
tar -xJf "$p2/nm.tar.xz"
lap "node_modules"
cp "$p2/libmlxb.so" .native/device/libmlxb.so
lap "libmlxb.so"
