"""Batched decode's quantized matmuls on MLX's CUDA backend: x as [B, 1, K] (what mlx-lm passes:
from 8 rows, B one-row problems of MLX's qmm_sm80) against x as one [B, K] matrix (what mlx-bun's
quantized_linear passes on sm90 by default, packages/mlx-ops/src/kernels/qmv.ts). Bit equality on the 12B- and
1B-shaped layers for B = 2..32, 4 and 8 bits, then the time of each at B = 16 (weights rotated over
copies larger than L2). Exits 1 on any difference.
    python tools/bench/device/qmm-fold-check.py [--json OUT]
"""
import json
import sys
import time

import mlx.core as mx

SHAPES = {  # (N, K): out × in
    "12B q/k/v": (8192, 3840),
    "12B o": (3840, 4096),
    "12B gate/up": (30720, 3840),
    "12B down": (3840, 15360),
    "12B lm_head": (262144, 3840),
    "1B q/k/v": (2560, 1536),
    "1B gate/up": (12288, 1536),
    "1B down": (1536, 6144),
    "1B lm_head": (262144, 1536),
}
mx.random.seed(0)
bad = 0
report = {"equal": [], "time_ms": {}}
for name, (n, k) in SHAPES.items():
    for bits in (4, 8):
        w = (mx.random.normal((n, k)) * 0.05).astype(mx.bfloat16)
        wq, s, b = mx.quantize(w, group_size=64, bits=bits)
        for batch in (2, 3, 8, 16, 17, 32):
            x = mx.random.normal((batch, 1, k)).astype(mx.bfloat16)
            a = mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=64, bits=bits)
            f = mx.quantized_matmul(x.reshape(batch, k), wq, s, b, transpose=True, group_size=64, bits=bits).reshape(batch, 1, n)
            diff = int((a != f).sum().item())
            report["equal"].append({"shape": name, "bits": bits, "B": batch, "differing": diff})
            bad += diff != 0
            print(f"{name} {n}x{k} {bits}-bit B={batch}: {'equal' if diff == 0 else f'{diff} values differ'}", flush=True)
        if bits == 8 or name.endswith("lm_head") and n * k > 5e8:
            continue
        # Time at B = 16: enough copies of the weights to pass L2 (50 MB), one evaluation per call.
        copies = [mx.quantize((mx.random.normal((n, k)) * 0.05).astype(mx.bfloat16), group_size=64, bits=4) for _ in range(max(2, int(2e8 // (n * k // 2)) + 1))]
        mx.eval(copies)
        x = mx.random.normal((16, 1, k)).astype(mx.bfloat16)
        t = {}
        for label, xin in (("[16, 1, K]", x), ("[16, K]", x.reshape(16, k))):
            best = []
            for rep in range(5):
                mx.synchronize()
                t0 = time.perf_counter()
                for c in copies:
                    mx.eval(mx.quantized_matmul(xin, *c, transpose=True, group_size=64, bits=4))
                mx.synchronize()
                best.append((time.perf_counter() - t0) * 1e3 / len(copies))
            t[label] = sorted(best)[len(best) // 2]
        report["time_ms"][name] = t
        print(f"  time at B=16, 4-bit: [16, 1, K] {t['[16, 1, K]']:.3f} ms, [16, K] {t['[16, K]']:.3f} ms", flush=True)
        del copies
print(f"RESULT {'PASS' if bad == 0 else 'FAIL'} ({len(report['equal'])} comparisons, {bad} differing)")
if "--json" in sys.argv:
    json.dump(report, open(sys.argv[sys.argv.index("--json") + 1], "w"), indent=1)
sys.exit(1 if bad else 0)
