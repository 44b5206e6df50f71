"""Where an attend's GPU time goes: sums an Nsight Compute CSV of kv-cache.ts --profile-last.

  ncu --profile-from-start off --metrics gpu__time_duration.sum --clock-control none --csv \\
    --print-kernel-base function .native/bin/bun tools/bench/kv-cache.ts --profile-last --layers 8 ... > t.csv
  python3 tools/kernels/attend-timeline.py t.csv 8 "bf16;turbo:4,3"

The bench records each mode's last evaluation of LAYERS attends, then a marker kernel
(mlxb_profile_marker): the sections between markers are the modes, in the bench's order.
Prints per mode each kernel's launches and µs per attend, and the sum (kernels serialized by
ncu: their own time, without launch gaps).
"""

import csv
import sys
from collections import defaultdict

# ncu writes "nsecond" or "ns" (and so on) depending on its version.
UNITS = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6, "ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


def kernels(path: str) -> list[tuple[str, float]]:
    """(kernel name, µs) in launch order."""
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    out = []
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        out.append((row["Kernel Name"], value * UNITS[row["Metric Unit"]]))
    return out


def main() -> None:
    path, layers = sys.argv[1], int(sys.argv[2])
    modes = sys.argv[3].split(";") if len(sys.argv) > 3 else []
    sections: list[list[tuple[str, float]]] = [[]]
    for name, us in kernels(path):
        if "mlxb_profile_marker" in name:  # MLX names it custom_kernel_mlxb_profile_marker...
            sections.append([])
        else:
            sections[-1].append((name, us))
    sections = [s for s in sections if s]
    for i, sec in enumerate(sections):
        mode = modes[i] if i < len(modes) else f"section {i + 1}"
        by: dict[str, list[float]] = defaultdict(list)
        for name, us in sec:
            by[name].append(us)
        total = sum(us for _, us in sec)
        print(f"\n{mode}: {len(sec)} kernels for {layers} attends, {total / layers:.1f} µs of kernel time per attend\n")
        print("| kernel | launches per attend | µs per attend |")
        print("| --- | --- | --- |")
        for name, v in sorted(by.items(), key=lambda kv: -sum(kv[1])):
            print(f"| {name[:90]} | {len(v) / layers:g} | {sum(v) / layers:.1f} |")


if __name__ == "__main__":
    main()
