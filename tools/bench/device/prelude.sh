# Sourced first by the device scripts: strict mode, the repository root as $root and the working
# directory, and $OUT (what comes back from the device machine) created.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
cd "$root"
OUT="${OUT:-/tmp/h200-out}"
mkdir -p "$OUT"
