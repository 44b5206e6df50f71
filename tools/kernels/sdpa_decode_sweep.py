"""Where the decode attention kernels give MLX's bits on a GPU: a sweep of shapes.

Usage: python sdpa_decode_sweep.py kernel-sources.json [--emulate]   (on a CUDA machine; sources from export-sources.ts)

For each (B, Hq, Hkv, D, T) the two kernels of packages/mlx-ops/src/kernels/sdpa-decode.ts run against
MLX's composition on the same inputs (its q·kᵀ, then its precise softmax and p·v on the same scores),
and both against the correctly rounded product (float32 sums on the CPU from the same bf16 operands,
rounded once). MLX folds the query heads of one KV head into the rows of one matmul when the batch
and the KV heads are one (B·Hkv = 1, Hq > Hkv: mlx/backend/cuda/matmul.cpp collapses the broadcast
batch into M), and cuBLAS may then split the sum and reduce the parts in the dtype; otherwise q·kᵀ
is MLX's gemv and p·v a cuBLAS product of one row. Prints one line per shape: the share of values
differing, ours vs MLX and each vs the rounded product, and whether MLX folds. Ends with
`SUMMARY unfolded: ... folded: ...` (the largest share of differing values in each class).
"""
import json
import sys

import mlx.core as mx

from check_cuda_kernels import Sliced, compiled, sdpa_decode_score_refs, sdpa_decode_scores, sdpa_decode_value_refs, sdpa_decode_values

HEADS = [(16, 8), (16, 1), (8, 1), (16, 2), (8, 8), (4, 1), (32, 16), (2, 1)]
DIMS = [256, 512]
KEYS = [1, 7, 77, 100, 255, 513, 1000, 1024]


def differ(a, b):
    return mx.mean((a.astype(mx.float32) != b.astype(mx.float32)).astype(mx.float32)).item()


def main() -> None:
    specs = {s["name"]: s for s in json.load(open(sys.argv[1]))}
    # --emulate: the script's own check on a CPU (three shapes, the bodies through cuda_emu.h).
    emulate = "--emulate" in sys.argv
    if emulate:
        mx.set_default_device(mx.cpu)
    else:
        assert mx.cuda.is_available(), "no CUDA backend in this MLX"
        mx.set_default_device(mx.gpu)
    ks = compiled(specs["mlxb_sdpa_decode_scores"], emulate)
    kv = compiled(specs["mlxb_sdpa_decode_values"], emulate)
    heads, dims, keys = (HEADS[:2], DIMS[:1], KEYS[2:4]) if emulate else (HEADS, DIMS, KEYS)
    worst = {False: [0.0, 0.0], True: [0.0, 0.0]}
    print("B Hq Hkv D T folded | scores: ours≠MLX ours≠exact MLX≠exact | values: ours≠MLX ours≠exact MLX≠exact", flush=True)
    seed = 0
    for b in (1, 2):
        for hq, hkv in heads:
            for d in dims:
                if (hq // hkv) * d > 8192:
                    continue
                for t in keys:
                    seed += 1
                    mx.random.seed(seed)
                    dt = mx.bfloat16
                    rep = hq // hkv
                    q = mx.random.normal((b, hq, 1, d)).astype(dt)
                    kf = Sliced(mx.random.normal((b, hkv, t + 13, d)).astype(dt), t)
                    vf = Sliced(mx.random.normal((b, hkv, t + 13, d)).astype(dt), t)
                    s = sdpa_decode_scores(ks, q, kf, hkv)
                    s_mlx, s_ex = sdpa_decode_score_refs(q, kf, hkv)
                    o = sdpa_decode_values(kv, s_mlx, vf, hkv)
                    o_mlx, o_ex = sdpa_decode_value_refs(s_mlx, vf, hkv)
                    folded = b * hkv == 1 and rep > 1
                    r = [differ(s, s_mlx), differ(s, s_ex), differ(s_mlx, s_ex), differ(o, o_mlx), differ(o, o_ex), differ(o_mlx, o_ex)]
                    w = worst[folded]
                    w[0], w[1] = max(w[0], r[0]), max(w[1], r[3])
                    print(f"{b} {hq} {hkv} {d} {t} {'yes' if folded else 'no'} | "
                          + " ".join(f"{x:.2%}" for x in r[:3]) + " | " + " ".join(f"{x:.2%}" for x in r[3:]), flush=True)
    print(f"SUMMARY unfolded: scores ≤ {worst[False][0]:.2%}, values ≤ {worst[False][1]:.2%} differ from MLX; "
          f"folded: scores ≤ {worst[True][0]:.2%}, values ≤ {worst[True][1]:.2%}")


if __name__ == "__main__":
    main()
