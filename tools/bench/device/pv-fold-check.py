"""Decode attention on MLX's CUDA backend: mx.fast.scaled_dot_product_attention (what mlx-lm calls;
for one query row MLX composes q·kᵀ, a precise softmax and p·v, the p·v over [B, Hkv, repeats, 1, L]
as cuBLAS's pointer-array batch after MLX's set_mm_device_pointers kernel) against the same
composition with p·v folded to [B, Hkv, repeats, L] (a strided batch, one launch fewer). Bit
equality over cache lengths for the 12B's sliding layers (16 query heads over 8 KV heads of 256)
and full layers (16 over 1 of 512) and the 1B's; exits 1 on any difference.
    python tools/bench/device/pv-fold-check.py
"""
import sys

import mlx.core as mx

CONFIGS = {  # name: (query heads, KV heads, head dim)
    "12B sliding": (16, 8, 256),
    "12B full": (16, 1, 512),
    "1B sliding": (8, 1, 256),
    "1B full": (8, 1, 512),
}
LENGTHS = [1, 2, 3, 7, 16, 31, 64, 100, 127, 128, 255, 256, 300, 511, 512, 513, 700, 1000, 1023, 1024, 1500, 2048, 3000, 4096]

mx.random.seed(0)
bad = 0
for name, (hq, hkv, d) in CONFIGS.items():
    rep = hq // hkv
    for n in LENGTHS:
        q = mx.random.normal((1, hq, 1, d)).astype(mx.bfloat16)
        k = mx.random.normal((1, hkv, n, d)).astype(mx.bfloat16)
        v = mx.random.normal((1, hkv, n, d)).astype(mx.bfloat16)
        ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=1.0)
        q5 = q.reshape(1, hkv, rep, 1, d)
        s = q5 @ mx.swapaxes(mx.expand_dims(k, 2), -1, -2)
        p = mx.softmax(s, axis=-1, precise=True)
        unfolded = (p @ mx.expand_dims(v, 2)).reshape(1, hq, 1, d)
        folded = (p.reshape(1, hkv, rep, n) @ v).reshape(1, hq, 1, d)
        mx.eval(ref, unfolded, folded)
        du = int((ref != unfolded).sum().item())
        df = int((ref != folded).sum().item())
        bad += df != 0
        print(f"{name} L={n}: composition {'equal' if du == 0 else f'{du} differ'}, folded p·v {'equal' if df == 0 else f'{df} differ'}", flush=True)
print("PASS" if bad == 0 else f"FAIL: {bad} cases differ")
sys.exit(1 if bad else 0)
