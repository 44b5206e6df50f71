# Sourced first by the device scripts: strict mode, the repository root as $root and the working
# directory, and $OUT (what comes back from the device machine) created.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
cd "$root"
OUT="${OUT:-/tmp/h200-out}"
mkdir -p "$OUT"

# For the scripts run in steps (STEPS, a space-separated list, and DEADLINE, seconds for the
# script): whether step $1 is asked for, and the seconds left. Python (MLX_BUN_PYTHON, as run-h200.sh
# exports it), the bench checkpoints' paths and Bun.
step_on() { [[ " ${STEPS:-} " == *" $1 "* ]]; }
secs_left() { echo $((${DEADLINE:-600} - SECONDS)); }
PY="${MLX_BUN_PYTHON:-python3}"
B=.native/bin/bun
M12="${M12:-.native/bench-models/gemma4-12b-4bit}"
M1="${M1:-.native/bench-models/gemma4-1b-4bit}"
