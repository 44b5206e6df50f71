#!/usr/bin/env bash
# turbo looks for the package manager's binary on PATH: put the set-up's Bun there.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PATH="$root/.native/bin:$PATH" TURBO_TELEMETRY_DISABLED=1 DO_NOT_TRACK=1
exec "$root/node_modules/.bin/turbo" "$@"
