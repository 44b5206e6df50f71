"""The mlx-ops qmv kernel (packages/mlx-ops/src/kernels/qmv.ts) against MLX's quantized_matmul on
a CUDA machine, at the decode shapes of the 12B-shaped and 1B bench models (bf16 activations,
4-bit group 64 unless noted), through Python MLX (no Bun needed):

  python tools/kernels/bench_qmv.py kernel-sources.json [--sweep] [--ncu] [--quick]

Default: per shape and M, microseconds per call and GB/s of weights + scales + biases read, for
ours (the TypeScript launch heuristic, mirrored in check_cuda_kernels.py) and MLX's; each call
reads one of C copies of the weights (C × bytes ≥ 256 MB, so the 50 MB L2 never holds them) and
R calls run in one evaluation (what a decode step's graph does). Each output is also compared
with MLX's (max |diff| relative to max |ref|).
"exact" rows: mlxb_qmv_exact (packages/mlx-ops/src/kernels/qmv-exact.ts), MLX's own arithmetic
with wider loads, where MLX's qmv runs (M·B < 8 rows, 4- or 8-bit, group size < K); its rel err must be 0.
"exact staged" rows: the same kernel's staged launch (x in shared memory, RPW rows of w a warp).
--sweep: M = 1 over every (RPW, SPLIT) for the 12B shapes, to check the heuristic.
--ncu: the same calls once each, for `ncu --kernel-name regex:qmv` (kernel time and DRAM bytes
per launch, L2 flushed before each); prints the launch order as `NCU-ORDER i label`.
"""
import json
import math
import sys
import time

import mlx.core as mx

sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
from check_cuda_kernels import qmv_config, qmv_exact_launch, qmv_launch  # noqa: E402

SHAPES_12B = [("12B gate/up", 15360, 3840), ("12B down", 3840, 15360), ("12B q", 4096, 3840), ("12B k/v", 2048, 3840),
              ("12B o", 3840, 4096), ("12B q full", 8192, 3840), ("12B o full", 3840, 8192), ("12B lm_head", 262144, 3840)]
# Shapes whose exact rows are also timed with 2 and 8 chunks in flight (qmv-exact.ts, QMV_EXACT_CHUNKS).
CHUNK_SWEEP = ("12B gate/up", "12B down", "12B q", "12B lm_head", "1B gate/up wide", "1B lm_head")
# More shapes whose one-row product is also timed through the staged launch (qmv-exact.ts, MLX_BUN_QMV_STAGED).
STAGED_TOO = ("12B q full", "12B o", "12B k/v", "1B gate/up", "1B down", "1B q")
SHAPES_1B = [("1B gate/up", 6144, 1536), ("1B down", 1536, 6144), ("1B gate/up wide", 12288, 1536), ("1B down wide", 1536, 12288),
             ("1B q", 2048, 1536), ("1B k/v", 256, 1536), ("1B o", 1536, 2048), ("1B lm_head", 262144, 1536)]


def make(n, k, bits, gs, copies):
    ws = []
    for c in range(copies):
        key = mx.random.key(1000 * n + k + c)
        w = (mx.random.normal((n, k), key=key) * (1 / math.sqrt(k))).astype(mx.bfloat16)
        ws.append(mx.quantize(w, group_size=gs, bits=bits))
        mx.eval(ws[-1])
        del w
    return ws


def nbytes(q):
    return sum(a.nbytes for a in q)


def main():
    args = sys.argv[1:]
    specs = {s["name"]: s for s in json.load(open(args[0]))}
    spec = specs["mlxb_qmv"]
    sweep, ncu, quick = "--sweep" in args, "--ncu" in args, "--quick" in args
    global SHAPES_12B, SHAPES_1B
    if "--dry" in args:  # no GPU: the flow of the script on small shapes, MLX's op standing in for ours
        SHAPES_12B = [(l, max(64, n // 64), max(256, k // 16)) for l, n, k in SHAPES_12B]
        SHAPES_1B = [(l, max(64, n // 64), max(256, k // 16)) for l, n, k in SHAPES_1B]

        def kern(inputs, output_shapes, output_dtypes, template, **_):
            t = dict(template)
            return [mx.quantized_matmul(inputs[0], *inputs[1:], transpose=True, group_size=t["GS"], bits=t.get("BITS", 4))]
        kern_exact = kern
    else:
        kern = mx.fast.cuda_kernel(name="mlxb_qmv", input_names=spec["input_names"], output_names=spec["output_names"],
                                   source=spec["cuda"]["source"], header=spec["cuda"].get("header", ""))
        xs = specs["mlxb_qmv_exact"]
        kern_exact = mx.fast.cuda_kernel(name="mlxb_qmv_exact", input_names=xs["input_names"], output_names=xs["output_names"],
                                         source=xs["cuda"]["source"], header=xs["cuda"].get("header", ""))
        mx.set_default_device(mx.gpu)

    def ours(x, q, bits, gs, cfg):
        n, k = q[0].shape[0], x.shape[-1]
        m = x.size // k
        return kern(inputs=[x, *q], output_shapes=[(*x.shape[:-1], n)], output_dtypes=[x.dtype],
                    **qmv_launch(m, n, k, bits, gs, x.dtype, *cfg))[0]

    def exact(x, q, bits, gs, chunks=4):
        n, k = q[0].shape[0], x.shape[-1]
        return kern_exact(inputs=[x, *q], output_shapes=[(*x.shape[:-1], n)], output_dtypes=[x.dtype],
                          **qmv_exact_launch(x.size // k, n, k, gs, bits, chunks))[0]

    def exact_staged(x, q, bits, gs, chunks=4):
        n, k = q[0].shape[0], x.shape[-1]
        return kern_exact(inputs=[x, *q], output_shapes=[(*x.shape[:-1], n)], output_dtypes=[x.dtype],
                          **qmv_exact_launch(x.size // k, n, k, gs, bits, chunks, staged=True))[0]

    def theirs(x, q, bits, gs, cfg=None):
        return mx.quantized_matmul(x, *q, transpose=True, group_size=gs, bits=bits)

    plan = []  # (label, n, k, bits, gs, m, configs)
    for label, n, k in SHAPES_12B + SHAPES_1B:
        plan.append((label, n, k, 4, 64, 1, None))
    for label, n, k in SHAPES_12B[:2]:  # 8-bit: MLX's float-accumulating qmv against the exact kernel
        plan.append((label + " 8-bit", n, k, 8, 64, 1, None))
    label, n, k = SHAPES_12B[0]
    for m in (2, 4):  # a few rows: MLX's qmv reads the weights once a row, the exact kernel once
        plan.append((label, n, k, 4, 64, m, None))
        plan.append((label + " 8-bit", n, k, 8, 64, m, None))
    if not quick:
        for label, n, k in SHAPES_12B[:2]:
            for m in (8, 16):
                plan.append((label, n, k, 4, 64, m, None))
        plan.append(("12B gate/up g32", 15360, 3840, 4, 32, 1, None))
        plan.append(("12B gate/up g128", 15360, 3840, 4, 128, 1, None))
    if sweep:
        for label, n, k in [SHAPES_12B[i] for i in (0, 1, 3, 4, 7)]:
            plan.append((label + " sweep", n, k, 4, 64, 1, [(1, r, s) for r in (2, 4, 8) for s in (1, 2, 4)]))

    rows, order = [], []
    cache = {}
    for label, n, k, bits, gs, m, cfgs in plan:
        key = (n, k, bits, gs)
        if key not in cache:
            cache.clear()
            per = nbytes(mx.quantize(mx.zeros((64, k), dtype=mx.bfloat16), group_size=gs, bits=bits)) * n / 64
            copies = 1 if ncu else max(1, min(48, math.ceil(256e6 / per)))
            cache[key] = (make(n, k, bits, gs, copies), per)
        qs, per = cache[key]
        x = mx.random.normal((m, k), key=mx.random.key(m)).astype(mx.bfloat16)
        mx.eval(x)
        cfg0 = qmv_config(m, n, k, bits)
        impls = [("mlx", theirs, None), ("ours", ours, cfg0)] + [(f"ours {c}", ours, c) for c in (cfgs or []) if c != cfg0]
        if m < 8:  # where MLX 0.32.4 runs its qmv (M·B < 8, group size < K)
            impls.append(("exact", exact, None))
            if m == 1 and bits == 4 and label in CHUNK_SWEEP:  # loads in flight: the default 4 chunks against 2 and 8
                impls += [(f"exact CH{c}", exact, c) for c in (2, 8)]
            if m == 1 and (label in CHUNK_SWEEP or label in STAGED_TOO):  # the staged launch (x in shared memory, RPW rows a warp)
                impls += [("exact staged", exact_staged, 4), ("exact staged CH8", exact_staged, 8)]
        if cfgs:
            impls = [i for i in impls[1:] if i[0] != "exact"]  # the sweep: ours only (mlx is in the plain row)
        ref = theirs(x, qs[0], bits, gs)
        mx.eval(ref)
        scale = max(1e-6, mx.max(mx.abs(ref.astype(mx.float32))).item())
        for name, f, cfg in impls:
            tag = f"{label} M={m} {bits}-bit g{gs} {name}" + (f" (MB,RPW,SPLIT)={cfg}" if isinstance(cfg, tuple) else "")
            out = f(x, qs[0], bits, gs, cfg) if cfg else f(x, qs[0], bits, gs)
            mx.eval(out)
            err = mx.max(mx.abs(out.astype(mx.float32) - ref.astype(mx.float32))).item() / scale
            if ncu:
                order.append(tag)
                print(f"NCU-ORDER {len(order) - 1} {tag}", flush=True)
                continue
            reps = max(len(qs) * 2, 24 if per < 64e6 else 6)
            best = math.inf
            for _ in range(4):
                mx.synchronize()
                t0 = time.perf_counter()
                outs = [f(x, qs[i % len(qs)], bits, gs, cfg) if cfg else f(x, qs[i % len(qs)], bits, gs) for i in range(reps)]
                mx.eval(outs)
                mx.synchronize()
                best = min(best, (time.perf_counter() - t0) / reps)
                del outs
            gbs = per / best / 1e9
            rows.append(dict(label=label, m=m, bits=bits, gs=gs, impl=name, cfg=cfg, us=best * 1e6, gbs=gbs, bytes=per, rel_err=err))
            print(f"{tag}: {best * 1e6:8.1f} us  {gbs:7.1f} GB/s  ({per / 1e6:.1f} MB, {len(qs)} copies)  rel err vs mlx {err:.2e}", flush=True)
    if not ncu:
        print("BENCH-JSON " + json.dumps(rows))


if __name__ == "__main__":
    main()
