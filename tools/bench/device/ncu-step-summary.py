"""One decode step per path, kernel by kernel, from the CSV that ncu writes over
decode-step-profile.ts --ncu (tools/kernels/qmv-h200.sh, steps ncu12b / ncu1b):

  python tools/bench/device/ncu-step-summary.py STEP.csv[.xz] [--top 25]

The kernels before the marker kernel (mlxb_profile_marker) are the first path's step, those after
it the second's. For each: launches, summed kernel time and DRAM bytes read, by kind of kernel (a
name match below), then the TOP most frequent kernel names with their launches and time, so a name
the kinds miss is still seen.
"""
import csv
import io
import lzma
import sys
from collections import defaultdict

# (kind, substrings of the demangled base name); the first match wins.
KINDS = [
    ("marker", ("mlxb_profile_marker",)),
    ("quantized matmul", ("qmv", "qmm", "quantized", "affine")),
    ("norms (MLX's or exact, RoPE fused)", ("rms_norm", "norm_exact", "mlxb_residual", "layer_norm")),
    ("RoPE", ("rope",)),
    ("softmax", ("softmax",)),
    ("cuBLAS / CUTLASS matmul (attention)", ("gemv", "gemm", "xmma", "cutlass", "cublas", "splitK", "Kernel2")),
    ("reductions, argmax, logsumexp", ("reduce", "arg_", "logsumexp", "all_reduce", "row_reduce", "col_reduce")),
    ("gather / slice update / copy", ("gather", "scatter", "slice", "copy")),
    ("binary / unary / compiled elementwise", ("binary", "unary", "ternary", "compiled", "fused", "Compiled")),
]


def kind_of(name):
    low = name.lower()
    for kind, keys in KINDS:
        if any(k.lower() in low for k in keys):
            return kind
    return "other"


def rows_of(path):
    raw = lzma.open(path, "rt") if path.endswith(".xz") else open(path)
    lines = raw.read().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith('"ID"'))
    return list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))


def main():
    args = sys.argv[1:]
    top = int(args[args.index("--top") + 1]) if "--top" in args else 25
    path = next(a for a in args if not a.startswith("--") and not a.isdigit())
    kernels = {}  # ID -> {name, metrics}
    for r in rows_of(path):
        k = kernels.setdefault(int(r["ID"]), {"name": r["Kernel Name"], "m": {}})
        v = r["Metric Value"].replace(",", "")
        try:
            value = float(v)
        except ValueError:
            continue
        unit = r.get("Metric Unit", "")
        # ncu 2025 writes "nsecond", later ones "ns": both to ms (and bytes to MB).
        scale = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3, "s": 1e3,
                 "byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3}.get(unit)
        if scale is None:
            sys.exit(f"ncu-step-summary: unknown unit {unit!r} of {r['Metric Name']}")
        k["m"][r["Metric Name"]] = value * scale  # ms and MB
    steps, cur = [], []
    for i in sorted(kernels):
        if kind_of(kernels[i]["name"]) == "marker":
            steps.append(cur)
            cur = []
        else:
            cur.append(kernels[i])
    steps.append(cur)
    steps = [s for s in steps if s]
    for n, step in enumerate(steps):
        by = defaultdict(lambda: [0, 0.0, 0.0])
        names = defaultdict(lambda: [0, 0.0])
        for k in step:
            t = k["m"].get("gpu__time_duration.sum", 0.0)
            rd = k["m"].get("dram__bytes_read.sum", 0.0)
            e = by[kind_of(k["name"])]
            e[0] += 1
            e[1] += t
            e[2] += rd
            names[k["name"]][0] += 1
            names[k["name"]][1] += t
        total = [sum(v[i] for v in by.values()) for i in range(3)]
        print(f"\nstep {n + 1}: {total[0]} kernels, {total[1]:.2f} ms, {total[2]:.0f} MB read")
        print("| kind | launches | ms | share | MB read |")
        print("|---|---|---|---|---|")
        for kind, (c, t, rd) in sorted(by.items(), key=lambda kv: -kv[1][1]):
            print(f"| {kind} | {c} | {t:.2f} | {100 * t / max(total[1], 1e-9):.0f}% | {rd:.0f} |")
        print(f"top {top} kernel names (launches, ms):")
        for name, (c, t) in sorted(names.items(), key=lambda kv: -kv[1][0])[:top]:
            print(f"  {c:5d} {t:7.3f}  {name[:110]}")


if __name__ == "__main__":
    main()
