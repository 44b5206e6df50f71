"""Try the CUDA sources exported by tools/kernels/export-sources.ts on a CUDA machine.

Usage: python check_cuda_kernels.py kernel-sources.json [--only NAME[,NAME...]] [--match TEXT] [--emulate] [--quick]
  (needs mlx + mlx-cuda-13; with --emulate: mlx (CPU) + g++ ≥ 12, no GPU; --quick: the decode and
  encode cases in bfloat16 only, contexts up to 4096, as the kv-cache test suite runs them emulated)

Each kernel's CUDA body runs through mx.fast.cuda_kernel on the cases below and is compared with
its reference composition (as in the kernels' TypeScript `reference` functions) evaluated on
float32 copies of the inputs and rounded to the dtype (the sources compute in float32 and round
once), within the tolerances of the TypeScript kernel tests. The decode-attention kernels are
also run end to end (pass 1 then pass 2) against float32 attention over the decoded planes.

--emulate compiles each body with g++ inside the signature MLX's cuda_kernel generates, on top
of tools/kernels/cuda_emu.h (threads as std::threads, warp shuffles through a barrier), and runs
it on the CPU: it checks a body's arithmetic, indexing and control flow where there is no GPU,
not NVRTC's acceptance of it nor its speed.
"""
import ctypes
import ctypes.util
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile

import mlx.core as mx
import mlx.nn as nn
import numpy as np

TOL = {mx.float32: (1e-6, 1e-5), mx.bfloat16: (1e-6, 2**-7), mx.float16: (1e-6, 2**-10)}
HERE = os.path.dirname(os.path.abspath(__file__))


class Sliced:
    """The first `t` tokens (axis 2) of a buffer with room for more: a strided view, as the
    cache's fetched planes are (the decode kernels read them through their strides)."""

    def __init__(self, full, t):
        self.full, self.t = full, t

    @property
    def mx(self):
        return self.full[:, :, : self.t]


class Strided(Sliced):
    """The same tokens as Sliced from a buffer stored transposed ([B, H, X, T]): a plane whose last
    axis is not contiguous, which the kernels read with their generic (strided) loads."""

    def __init__(self, full, t):
        super().__init__(mx.contiguous(full.swapaxes(2, 3)), t)

    @property
    def mx(self):
        return self.full.swapaxes(2, 3)[:, :, : self.t]


def as_mx(a):
    return a.mx if isinstance(a, Sliced) else a


# ----------------------------------------------------------------------------- geglu, turbo_values


def geglu_cases():
    for dt, tol in TOL.items():
        for shape in [(1000,), (3, 7, 129), (2, 4096), (1,), (257,)]:
            mx.random.seed(0)
            g, u = (mx.random.normal(shape).astype(dt) for _ in range(2))
            ref = (nn.gelu_approx(g.astype(mx.float32)) * u.astype(mx.float32)).astype(dt)
            yield f"{dt} {shape}", dict(inputs=[g, u], template=[("T", dt)], grid=(g.size, 1, 1),
                                         threadgroup=(256, 1, 1), output_shapes=[shape], output_dtypes=[dt]), [ref], [tol]


def unpack_bits(packed, bits, dim):
    """Little-endian bit stream per row (mlx-ops pack_bits) → uint32 codes [..., dim]."""
    b = (packed[..., :, None].astype(mx.uint32) >> mx.arange(8, dtype=mx.uint32)) & 1
    b = b.reshape(*packed.shape[:-1], -1)[..., : dim * bits].reshape(*packed.shape[:-1], dim, bits)
    return (b * mx.left_shift(mx.array(1, dtype=mx.uint32), mx.arange(bits, dtype=mx.uint32))).sum(-1)


def turbo_values_cases():
    for dt in (mx.bfloat16, mx.float16, mx.float32):
        for bits in (2, 3, 4):
            for lead, dim in [((1, 2, 9), 128), ((2, 1, 33), 256), ((1, 1, 1), 64), ((1, 4, 257), 512)]:
                mx.random.seed(bits)
                nbytes = math.ceil(dim * bits / 8)
                packed = mx.random.randint(0, 256, (*lead, nbytes)).astype(mx.uint8)
                scale = mx.random.uniform(0.1, 2.0, (*lead, 1)).astype(dt)
                centroids = mx.sort(mx.random.normal((2**bits,)))
                codes = unpack_bits(packed, bits, dim)
                ref = (centroids[codes] * scale.astype(mx.float32)).astype(dt)
                yield f"{dt} {bits}-bit {lead}x{dim}", dict(
                    inputs=[packed, scale, centroids], template=[("T", dt), ("BITS", bits), ("DIM", dim)],
                    grid=(math.prod(lead) * dim, 1, 1), threadgroup=(256, 1, 1),
                    output_shapes=[(*lead, dim)], output_dtypes=[dt]), [ref], [(0.0, 0.0)]


# ----------------------------------------------------------------------------- turbo_encode_values
# packages/kv-cache/src/kernels/turbo-encode.ts: its reference composition in MLX Python, run on
# the checked device. On CUDA the kernel repeats MLX's CUDA arithmetic, so bytes and scales must
# match exactly. The emulator's references run MLX's CPU kernels: another reduction order, and a
# Hadamard transform rounded to the dtype once (CUDA's rounds after every radix-16 step), so there
# a code may move to a neighbour: rarely in float32, about 1% of codes in bfloat16 / float16.


def pack_bits(codes, bits):
    """mlx-ops pack_bits: a little-endian bit stream per row → uint8 [..., n·bits/8]."""
    n = codes.shape[-1]
    b = (codes[..., :, None].astype(mx.uint32) >> mx.arange(bits, dtype=mx.uint32)) & 1
    b = b.reshape(*codes.shape[:-1], n * bits // 8, 8)
    return (b * mx.left_shift(mx.array(1, dtype=mx.uint32), mx.arange(8, dtype=mx.uint32))).sum(-1).astype(mx.uint8)


def turbo_encode_ref(v, signs, boundaries, bits):
    rot = mx.hadamard_transform(v * signs.astype(v.dtype))
    rot32 = rot.astype(mx.float32)
    rms32 = mx.sqrt(mx.mean(mx.square(rot32), axis=-1, keepdims=True))
    unit = rot32 / mx.maximum(rms32, 1e-30)
    codes = (unit[..., None] > boundaries).sum(-1).astype(mx.uint8)
    return pack_bits(codes, bits), rms32.astype(v.dtype)


def turbo_encode_cases(lloyd_boundaries):
    """lloyd_boundaries: bits → the codec's Lloyd-Max boundaries (export-sources.ts writes them)."""
    for dt in (mx.bfloat16, mx.float16, mx.float32):
        for bits in (2, 3, 4):
            for lead, dim in [((1, 8, 1), 512), ((1, 8, 37), 512), ((2, 2, 3), 256), ((1, 1, 5), 128), ((1, 3, 2), 64)]:
                mx.random.seed(bits * 7 + dim)
                v = (mx.random.normal((*lead, dim)) * 0.3).astype(dt)
                v = mx.concatenate([mx.zeros((*lead[:-1], 1, dim), dtype=dt), v[..., 1:, :]], axis=-2) if lead[-1] > 2 else v
                signs = mx.where(mx.random.uniform(shape=(dim,)) < 0.5, -1.0, 1.0).astype(dt)
                boundaries = mx.array(lloyd_boundaries[str(bits)], dtype=mx.float32)
                yield (f"{dt} {bits}-bit {lead}x{dim}", bits, dim,
                       dict(inputs=[v, signs, boundaries], template=[("T", dt), ("D", dim), ("LOGD", int(math.log2(dim))),
                                                                     ("VB", bits), ("NBD", 2**bits - 1)],
                            grid=(math.prod(lead) * dim, 1, 1), threadgroup=(dim, 1, 1),
                            output_shapes=[(*lead, dim * bits // 8), (*lead, 1)], output_dtypes=[mx.uint8, dt]),
                       turbo_encode_ref(v, signs, boundaries, bits))


def check_turbo_encode(k, spec, emulate, quick=False):
    ok = True
    for label, bits, dim, launch, (ref_packed, ref_scale) in turbo_encode_cases(spec["codebook_boundaries"]):
        if quick and launch["inputs"][0].dtype != mx.bfloat16:
            continue
        packed, vscale = k(**launch)
        name = f"mlxb_turbo_encode_values {label}"
        if emulate:
            got, want = unpack_bits(packed, bits, dim).astype(mx.int32), unpack_bits(ref_packed, bits, dim).astype(mx.int32)
            moved = int(mx.sum(got != want).item())
            allowed = max(2, got.size // (500 if launch["output_dtypes"][1] == mx.float32 else 33))
            ok = compare(f"{name} codes ({moved} of {got.size} moved)", got, want, 1, 0) and moved <= allowed and ok
            ok = compare(f"{name} scale", vscale, ref_scale, 0, TOL[launch['output_dtypes'][1]][1]) and ok
        else:
            ok = compare(f"{name} packed", packed, ref_packed, 0, 0) and ok
            ok = compare(f"{name} scale", vscale, ref_scale, 0, 0) and ok
    return ok


# ----------------------------------------------------------------------------- turbo_unrotate
# packages/kv-cache/src/kernels/turbo-unrotate.ts: signs ⊙ H y / √D as mx.hadamard_transform and a
# multiply (mlx-ops fwht_inverse). On CUDA the kernel repeats MLX's CUDA rounding: exact. The
# emulator's reference runs MLX's CPU transform, rounded once: within a few ulps of the dtype.


def cuda_hadamard_model(y, dt):
    """MLX's CUDA hadamard_transform arithmetic as hadamard-source.ts states it (the encode kernel
    that runs it wrote the composition's bytes on the H200): float32 radix-2 butterflies over
    ascending index bits, rounded to dt after every 4 bits and the last, × 1/√D rounded to dt."""
    d = y.shape[-1]
    logd = int(math.log2(d))
    x = y.astype(mx.float32)
    idx = mx.arange(d)
    for b in range(logd):
        other = x[..., idx ^ (1 << b)]
        x = mx.where((idx & (1 << b)) != 0, other - x, x + other)
        if (b & 3) == 3 or b == logd - 1:
            x = x.astype(dt).astype(mx.float32)
    return (x * np.float32(1.0 / math.sqrt(d))).astype(dt)


def turbo_unrotate_cases():
    for dt in (mx.bfloat16, mx.float16, mx.float32):
        for lead, dim in [((1, 8, 1), 512), ((1, 16, 1), 256), ((2, 4, 3), 256), ((1, 2, 5), 128), ((1, 3, 2), 64)]:
            mx.random.seed(dim + len(lead) * lead[-1])
            y = (mx.random.normal((*lead, dim)) * 0.05).astype(dt)
            signs = mx.where(mx.random.uniform(shape=(dim,)) < 0.5, -1.0, 1.0).astype(dt)
            ref = mx.hadamard_transform(y) * signs
            yield (f"{dt} {lead}x{dim}", dt,
                   dict(inputs=[y, signs], template=[("T", dt), ("D", dim), ("LOGD", int(math.log2(dim)))],
                        grid=(math.prod(lead) * dim, 1, 1), threadgroup=(dim, 1, 1),
                        output_shapes=[(*lead, dim)], output_dtypes=[dt]), ref)


def check_turbo_unrotate(k, emulate, quick=False):
    ok = True
    for label, dt, launch, ref in turbo_unrotate_cases():
        if quick and dt != mx.bfloat16:
            continue
        out = k(**launch)[0]
        if emulate:
            # MLX's CPU transform rounds once where CUDA's rounds after each radix-16 step and the
            # scale: within two ulps of the row's largest elements; the model of CUDA's rounding, exact.
            atol = 2 * TOL[dt][1] * mx.max(mx.abs(ref.astype(mx.float32))).item()
            ok = compare(f"mlxb_turbo_unrotate {label}", out, ref, atol, 0) and ok
            y, signs = launch["inputs"]
            ok = compare(f"mlxb_turbo_unrotate {label} (CUDA rounding model)", out, cuda_hadamard_model(y, dt) * signs, 0, 0) and ok
        else:
            ok = compare(f"mlxb_turbo_unrotate {label}", out, ref, 0, 0) and ok
    return ok


# ----------------------------------------------------------------------------- decode attention
# Mirrors packages/kv-cache/src/kernels/decode-plan.ts (decodePlan, partialsLaunch).
WARPS, MAX_WARPS, MIN_RUN, TILE_REGS, MAX_NT = 4, 8192, 32, 34, 8
# As decodePlan reads it: fewer query heads a warp (MLX_BUN_DECODE_LANE_FLOATS=16 or 8) checks those variants.
LANE_FLOATS = int(os.environ.get("MLX_BUN_DECODE_LANE_FLOATS") or 32)
COMBINE_WARPS = 16  # decode-source.ts
TURBO_VALUE_TOKEN_REGS = 3


def affine_token_regs(dim, bits, group):
    """decode-source.ts affineTokenRegs: raw words and scale/bias registers a lane holds per token."""
    lb = dim // 32 * bits
    words = lb // 32 if lb % 32 == 0 else 1 if 32 % lb == 0 else lb // 32 + 2
    return words + 2 * (1 if group % (dim // 32) == 0 else 2)


def plan(b, hq, hkv, dk, dv, t, token_regs):
    n_rep = hq // hkv
    per = max(dk, dv) // 32
    reps = next((r for r in range(n_rep, 0, -1) if n_rep % r == 0 and r * per <= LANE_FLOATS), 1)
    rows = b * hkv * (n_rep // reps)
    nt = max(1, min(MAX_NT, TILE_REGS // (token_regs + 1), 32 // 2 ** math.ceil(math.log2(reps))))
    run = math.ceil(max(MIN_RUN, math.ceil(t * rows / MAX_WARPS)) / nt) * nt
    parts = math.ceil(t / (run * WARPS))
    tpw = math.ceil(math.ceil(t / (parts * WARPS)) / nt) * nt  # decodeRunLength
    return dict(b=b, hq=hq, hkv=hkv, n_rep=n_rep, dk=dk, dv=dv, t=t, reps=reps, nt=nt, tpw=tpw, parts=parts)


def partials_launch(p, mask, extra, dt):
    rows = p["b"] * p["hq"]
    return dict(
        grid=(p["parts"] * (p["n_rep"] // p["reps"]) * WARPS * 32, p["b"] * p["hkv"], 1), threadgroup=(WARPS * 32, 1, 1),
        output_shapes=[(rows, p["parts"], p["dv"]), (rows, p["parts"]), (rows, p["parts"])],
        output_dtypes=[mx.float32] * 3,
        template=[("T", dt), ("DK", p["dk"]), ("DV", p["dv"]), ("NREP", p["n_rep"]), ("REPS", p["reps"]),
                  ("NT", p["nt"]), ("MASK_MODE", (0 if mask.size == 1 else 1) if mask.dtype == mx.bool_ else 2), *extra])


def ref_partials(p, qs, keys, values, mask):
    """decode-plan.ts referencePartials: per threadgroup's WARPS·tpw tokens (o, m, l) in float32."""
    B, H, R, P, tpw, T, dv = p["b"], p["hkv"], p["n_rep"], p["parts"], p["tpw"] * WARPS, p["t"], p["dv"]
    pad = P * tpw - T
    s = qs.astype(mx.float32).reshape(B, H, R, p["dk"]) @ keys.swapaxes(-1, -2)
    s = mx.where(mask, s, -3.4028234663852886e38) if mask.dtype == mx.bool_ else s + mask.astype(mx.float32)
    s = mx.pad(s, [(0, 0), (0, 0), (0, 0), (0, pad)], constant_values=-math.inf).reshape(B, H, R, P, tpw)
    m = s.max(-1, keepdims=True)
    e = mx.where(s == -math.inf, 0.0, mx.exp(s - m))
    v5 = mx.pad(values, [(0, 0), (0, 0), (0, pad), (0, 0)]).reshape(B, H, P, tpw, dv)
    o = (e.transpose(0, 1, 3, 2, 4) @ v5).transpose(0, 1, 3, 2, 4)
    return [o.reshape(B * H * R, P, dv), m.reshape(B * H * R, P), e.sum(-1).reshape(B * H * R, P)]


def ref_combine(po, pm, pl, b, hq, dt):
    top = pm.max(-1, keepdims=True)
    w = mx.where(pm == -math.inf, 0.0, mx.exp(pm - top))
    out = (po * w[..., None]).sum(1) / (w * pl).sum(-1, keepdims=True)
    return out.astype(dt).reshape(b, hq, 1, po.shape[2])


def combine_launch(p, dt):
    return dict(grid=(p["dv"] // 32 * COMBINE_WARPS * 32, p["b"] * p["hq"], 1), threadgroup=(COMBINE_WARPS * 32, 1, 1),  # decode-combine.ts
                output_shapes=[(p["b"], p["hq"], 1, p["dv"])], output_dtypes=[dt], template=[("T", dt), ("DV", p["dv"])])


def decode_mask(kind, b, t, dt):
    """[B, 1, 1, T] as the batched caches make it (row i hides its first 3i tokens), or one `true`."""
    if kind == "none":
        return mx.ones((1, 1, 1, 1), dtype=mx.bool_)
    vis = mx.arange(t)[None, :] >= mx.minimum(3 * mx.arange(b), t - 1)[:, None]
    vis = vis.reshape(b, 1, 1, t)
    return vis if kind == "bool" else mx.where(vis, 0.0, -1e9).astype(dt)


def sdpa_truth(qs, keys, values, mask):
    m = mask if mask.dtype == mx.bool_ else mask.astype(mx.float32)
    if m.size == 1:
        m = None
    return mx.fast.scaled_dot_product_attention(qs.astype(mx.float32), keys, values, scale=1.0, mask=m)


# (b, hq, hkv, d, t, mask): head dims 64/128/256(/512 TurboQuant), GQA 1/2/4/8, contexts
# below, at and past run lengths (1, 31, 33, 300, 1000, 1100, 4097, 4100: 32 / 64 / 256 tokens
# per warp, last run partial), every mask kind. BIG runs one bit width only (slow to emulate).
DECODE_SHAPES = [
    (1, 4, 4, 64, 1, "none"), (2, 8, 2, 128, 33, "bool"), (1, 8, 1, 256, 300, "additive"),
    (4, 8, 8, 64, 1100, "bool"), (1, 16, 2, 128, 4097, "none"), (3, 4, 2, 256, 31, "additive"),
    (1, 8, 2, 256, 1000, "none"),
]
BIG = (4, 8, 8, 64, 4100, "additive")
PASS1_TOL = (1e-4, 1e-4)  # (atol × max|ref|, rtol): the same float32 math summed in another order


def decode_inputs(shape, dt, seed):
    b, hq, hkv, d, t, kind = shape
    mx.random.seed(seed)
    cap = t + 7  # the planes are slices of longer buffers
    k = mx.random.normal((b, hkv, cap, d)).astype(dt)
    v = mx.random.normal((b, hkv, cap, d)).astype(dt)
    qs = (mx.random.normal((b, hq, 1, d)) * 0.125).astype(dt)
    return k, v, qs, decode_mask(kind, b, t, dt)


def affine_cases():
    for dt in (mx.bfloat16, mx.float16, mx.float32):
        # D96 / D160: three / five elements a lane, so its bits start mid-word and may span two groups.
        for i, shape in enumerate(DECODE_SHAPES + [BIG, (1, 4, 2, 96, 300, "bool"), (2, 8, 4, 160, 70, "additive")]):
            for bits, group in [(4, 64), (8, 32), (4, 128), (2, 64), (8, 64), (4, 32), (2, 32)]:
                if shape == BIG and (bits, group) != (4, 64):
                    continue
                if shape[3] % group or ((i + bits + group) % 3 and shape[3] not in (64, 96, 160)):
                    continue  # a spread of (bits, group) per shape, not the full product
                b, hq, hkv, d, t, kind = shape
                k, v, qs, mask = decode_inputs(shape, dt, i)
                kq = mx.quantize(k, group_size=group, bits=bits)
                vq = mx.quantize(v, group_size=group, bits=bits)
                deq = lambda w, s, z: mx.dequantize(w[:, :, :t], s[:, :, :t].astype(mx.float32), z[:, :, :t].astype(mx.float32),
                                                    group_size=group, bits=bits)
                keys, values = deq(*kq), deq(*vq)
                p = plan(b, hq, hkv, d, d, t, 2 * affine_token_regs(d, bits, group))
                # One shape per dtype with planes whose last axis is strided: the kernels' generic loads.
                wrap, layout = (Strided, " strided") if i == 2 else (Sliced, "")
                inputs = [qs, *(wrap(a, t) for a in (*kq, *vq)), mask]
                launch = dict(inputs=inputs, **partials_launch(p, mask, [("BK", bits), ("GK", group), ("BV", bits), ("GV", group)], dt))
                yield DecodeCase(f"{dt} {bits}-bit g{group} B{b} Hq{hq}/Hkv{hkv} D{d} T{t} mask {kind}{layout} (tpw {p['tpw']})",
                                 launch, p, qs, keys, values, mask, dt)


def turbo_cases():
    for dt in (mx.bfloat16, mx.float16, mx.float32):
        # D512: 3-bit values (48 bits a lane) and 4/2-bit ones (64 / 32 bits a lane, the widest span).
        for i, shape in enumerate(DECODE_SHAPES + [(1, 8, 1, 512, 300, "bool"), (2, 8, 2, 512, 70, "additive"), BIG]):
            for k_bits, v_bits in [(8, 4), (4, 3), (4, 2), (2, 3)]:
                if (i + k_bits + v_bits) % 2 or (shape == BIG and (k_bits, v_bits) != (4, 3)):
                    continue
                b, hq, hkv, d, t, kind = shape
                k, v, qs, mask = decode_inputs(shape, dt, 100 + i)
                kq = mx.quantize(k, group_size=32, bits=k_bits)
                # Value planes: random codes and positive scales (the kernel only decodes them).
                nbytes = d * v_bits // 8
                codes = mx.random.randint(0, 256, (b, hkv, t + 7, nbytes)).astype(mx.uint8)
                vscale = mx.random.uniform(0.1, 2.0, (b, hkv, t + 7, 1)).astype(dt)
                centroids = mx.sort(mx.random.normal((2**v_bits,)))
                keys = mx.dequantize(kq[0][:, :, :t], kq[1][:, :, :t].astype(mx.float32), kq[2][:, :, :t].astype(mx.float32),
                                     group_size=32, bits=k_bits)
                values = (centroids[unpack_bits(codes[:, :, :t], v_bits, d)] * vscale[:, :, :t].astype(mx.float32)).astype(dt).astype(mx.float32)
                p = plan(b, hq, hkv, d, d, t, affine_token_regs(d, k_bits, 32) + TURBO_VALUE_TOKEN_REGS)
                # One shape per dtype with planes whose last axis is strided: the kernels' generic loads.
                wrap, layout = (Strided, " strided") if i == 2 else (Sliced, "")
                inputs = [qs, *(wrap(a, t) for a in kq), wrap(codes, t), wrap(vscale, t), centroids, mask]
                launch = dict(inputs=inputs, **partials_launch(p, mask, [("BK", k_bits), ("GK", 32), ("VB", v_bits)], dt))
                yield DecodeCase(f"{dt} k{k_bits}/v{v_bits} B{b} Hq{hq}/Hkv{hkv} D{d} T{t} mask {kind}{layout} (tpw {p['tpw']})",
                                 launch, p, qs, keys, values, mask, dt)


def dense_cases():
    for dt in (mx.bfloat16, mx.float16, mx.float32):
        for i, shape in enumerate(DECODE_SHAPES + [(1, 8, 1, 512, 300, "bool"), (1, 16, 8, 512, 2100, "none"), BIG]):
            if dt == mx.float32 and i % 2:
                continue
            b, hq, hkv, d, t, kind = shape
            k, v, qs, mask = decode_inputs(shape, dt, 200 + i)
            p = plan(b, hq, hkv, d, d, t, math.ceil(2 * d // 32 * (4 if dt == mx.float32 else 2) / 4))
            inputs = [qs, Sliced(k, t), Sliced(v, t), mask]
            launch = dict(inputs=inputs, **partials_launch(p, mask, [], dt))
            keys, values = (a[:, :, :t].astype(mx.float32) for a in (k, v))
            yield DecodeCase(f"{dt} B{b} Hq{hq}/Hkv{hkv} D{d} T{t} mask {kind} (tpw {p['tpw']})", launch, p, qs, keys, values, mask, dt)


class DecodeCase:
    def __init__(self, label, launch, p, qs, keys, values, mask, dt):
        self.label, self.launch, self.p, self.qs, self.keys, self.values, self.mask, self.dt = label, launch, p, qs, keys, values, mask, dt


# ----------------------------------------------------------------------------- qmv
# Mirrors packages/mlx-ops/src/kernels/qmv.ts (qmv_config, qmv_launch_of).
QMV_WPB = 4


def qmv_config(m, n, k, bits):
    mb = 1 if m <= 1 else 2 if m <= 2 else 4 if m <= 4 else 8 if m <= 8 else 16
    rpw = 4 if mb <= 4 else 2
    chunks = k // (128 // bits)
    split = 4 if chunks >= 96 else 2 if chunks >= 48 else 1
    return mb, rpw, split


def qmv_launch(m, n, k, bits, gs, dt, mb, rpw, split):
    blocks = -(-n // (rpw * (QMV_WPB // split)))
    return dict(grid=(blocks * QMV_WPB * 32, -(-m // mb), 1), threadgroup=(QMV_WPB * 32, 1, 1),
                template=[("T", dt), ("BITS", bits), ("GS", gs), ("K", k), ("N", n), ("MB", mb), ("RPW", rpw), ("SPLIT", split)])


def qmv_inputs(lead, n, k, bits, gs, dt, seed):
    mx.random.seed(seed)
    x = mx.random.normal((*lead, k)).astype(dt)
    w = mx.random.normal((n, k)) * (1.0 / math.sqrt(k))
    wq, scales, biases = mx.quantize(w.astype(dt), group_size=gs, bits=bits)
    return x, wq, scales, biases


def qmv_ref(x, wq, scales, biases, gs, bits, dt):
    f = mx.float32
    return mx.quantized_matmul(x.astype(f), wq, scales.astype(f), biases.astype(f), transpose=True,
                               group_size=gs, bits=bits).astype(dt)


# (x leading shape, N, K, bits, group, forced (MB, RPW, SPLIT) or None for the heuristic): every
# MB bucket, RPW 1/2/4/8, SPLIT 1/2/4, ragged N (not a multiple of a block's rows), M not a
# multiple of MB and M > 16 (several blocks along y), chunks per lane from 1 to several.
QMV_SHAPES = [
    ((1,), 100, 256, 4, 64, None), ((1, 1), 37, 512, 4, 32, None), ((2,), 64, 1024, 4, 128, None),
    ((3,), 50, 256, 8, 32, None), ((1, 4), 33, 512, 8, 64, None), ((7,), 40, 256, 4, 64, None),
    ((2, 5), 19, 384, 4, 128, None), ((16,), 24, 256, 8, 128, None), ((37,), 10, 256, 4, 64, None),
    ((1,), 70, 4096, 4, 64, (1, 4, 4)), ((1,), 45, 2048, 8, 64, (1, 2, 2)), ((3,), 30, 1024, 4, 32, (4, 1, 4)),
    ((1,), 81, 512, 4, 64, (1, 8, 1)), ((5,), 26, 1024, 8, 32, (8, 2, 4)),
]


def qmv_cases():
    for i, (lead, n, k, bits, gs, forced) in enumerate(QMV_SHAPES):
        m = math.prod(lead)
        for dt in (mx.bfloat16, mx.float16, mx.float32):
            if dt == mx.float32 and i % 3:
                continue
            x, wq, scales, biases = qmv_inputs(lead, n, k, bits, gs, dt, i)
            cfg = forced or qmv_config(m, n, k, bits)
            ref = qmv_ref(x, wq, scales, biases, gs, bits, dt)
            atol = 1e-5 * max(1.0, mx.max(mx.abs(ref.astype(mx.float32))).item())
            yield (f"{dt} x{lead} N{n} K{k} {bits}-bit g{gs} (MB, RPW, SPLIT) = {cfg}",
                   dict(inputs=[x, wq, scales, biases], output_shapes=[(*lead, n)], output_dtypes=[dt],
                        **qmv_launch(m, n, k, bits, gs, dt, *cfg)),
                   [ref], [(atol, TOL[dt][1])])


# ----------------------------------------------------------------------------- qmv_exact
# packages/mlx-ops/src/kernels/qmv-exact.ts: MLX's CUDA qmv arithmetic (docs/custom-kernels.md,
# "MLX's CUDA matvec, as compiled"). On a GPU the reference is MLX's own op, at zero tolerance; in
# the emulator, a model of that arithmetic written from the SASS (below), at zero tolerance, and
# the float32 product within a loose bound (bf16 accumulators drift by a few ulps of the output).


def rne(hi, lo, bits, min_exp):
    """Round hi + lo (float64 arrays, lo the TwoSum error of hi) once, to nearest even, to `bits`
    significant bits with subnormals below 2**min_exp (bfloat16: 8, -133; float32: 24, -149)."""
    neg = np.signbit(hi)
    a, e = np.abs(hi), np.where(neg, -lo, lo)
    _, ex = np.frexp(a)
    ulp = np.ldexp(1.0, np.maximum(ex - bits, min_exp))
    units = a / ulp
    fl = np.floor(units)
    frac = units - fl
    up = (frac > 0.5) | ((frac == 0.5) & ((e > 0) | ((e == 0) & (np.fmod(fl, 2) == 1))))
    return np.where(neg, -1.0, 1.0) * (fl + up) * ulp


def fma_once(a, b, c, bits, min_exp):
    """a·b + c with one rounding: a·b is exact in float64 for bf16 inputs, the sum's error by TwoSum."""
    p = a * b
    s = p + c
    bb = s - p
    return rne(s, (p - (s - bb)) + (c - bb), bits, min_exp)


def fma_bf16(a, b, c):
    """bf16(a·b + c) with one rounding (HFMA2.BF16)."""
    return fma_once(a, b, c, 8, -133)


def mlx_cuda_qmv_model(x, wq, scales, biases, gs, bits=4):
    """MLX 0.32.4's qmv_kernel: 4-bit qmv_kernel<8, 16, …> (16 values a lane, chunks of 512, bf16
    accumulators, HFMA2) or 8-bit qmv_kernel<8, 8, …> (8 a lane, chunks of 256, float32 accumulators,
    FFMA); either way the weight is HFMA2.BF16(q, s, b), then 0 + a0 + a1 + … in float32, a butterfly."""
    k = x.shape[-1]
    e = 16 if bits == 4 else 8
    cw = 32 * e
    xs = np.array(x.astype(mx.float32), dtype=np.float64).reshape(-1, k)
    words = np.array(wq, dtype=np.uint64)
    n = words.shape[0]
    per = 32 // bits
    q = ((words[:, np.arange(k) // per] >> (bits * (np.arange(k) % per)).astype(np.uint64)) & (2**bits - 1)).astype(np.float64)
    sc = np.repeat(np.array(scales.astype(mx.float32), dtype=np.float64), gs, axis=1)
    bi = np.repeat(np.array(biases.astype(mx.float32), dtype=np.float64), gs, axis=1)
    w = fma_bf16(q, sc, bi)
    acc_fma = fma_bf16 if bits == 4 else (lambda a, b, c: fma_once(a, b, c, 24, -149))
    lanes, elems = np.arange(32)[:, None], np.arange(e)[None, :]
    outs = []
    for row in xs:
        acc = np.zeros((n, 32, e))
        chunks = [r * cw + lanes * e + elems for r in range(k // cw)]
        if k % cw:
            chunks.append((k // cw) * cw + lanes * e + elems)
        for idx in chunks:
            live = (idx < k)[None]
            j = np.minimum(idx, k - 1)
            acc = np.where(live, acc_fma(row[j][None], w[:, j], acc), acc)
        lane = np.zeros((n, 32), dtype=np.float32)
        for i in range(e):
            lane = lane + acc[:, :, i].astype(np.float32)
        for off in (16, 8, 4, 2, 1):
            lane = lane + lane[:, np.arange(32) ^ off]
        outs.append(lane[:, 0])
    out = np.stack(outs).reshape(*x.shape[:-1], n).astype(np.float32)
    return mx.array(out).astype(mx.bfloat16)  # float32 → bf16: MLX rounds to nearest even


# (x leading shape, N, K, group, bits[, chunks[, rows of w a warp: the staged launch; 0 = the launch's rule]]):
# one and several chunks, residues of K, ragged N, 1-9 rows.
QMV_EXACT_SHAPES = [((1,), 100, 512, 64, 4), ((1, 1), 37, 1024, 32, 4), ((1,), 19, 3840, 128, 4), ((2,), 24, 640, 64, 4),
                    ((1,), 41, 2304, 32, 4), ((1,), 16, 4096, 64, 4), ((1,), 9, 256, 128, 4), ((7, 1), 20, 1024, 64, 4),
                    ((9,), 12, 512, 64, 4),
                    ((1,), 100, 256, 64, 8), ((1, 1), 37, 1536, 32, 8), ((1,), 19, 3840, 128, 8), ((3,), 24, 640, 64, 8),
                    ((1,), 41, 2336, 32, 8), ((5, 1), 20, 1024, 64, 8), ((9,), 12, 320, 64, 8),
                    # other chunk counts in flight (a 6th field; 4 otherwise): the same bits whatever it is
                    ((1,), 19, 3840, 128, 4, 8), ((2,), 24, 640, 64, 4, 1), ((1,), 41, 2336, 32, 8, 3),
                    # the staged launch (a 7th field: rows of w a warp), across rows, ragged N and residues of K
                    ((1,), 100, 512, 64, 4, 4, 4), ((1, 1), 37, 1024, 32, 4, 3, 2), ((1,), 19, 3840, 128, 4, 4, 2),
                    ((1,), 41, 2304, 32, 4, 8, 8), ((3,), 24, 640, 64, 4, 4, 1), ((1,), 100, 256, 64, 8, 4, 4),
                    ((1,), 41, 2336, 32, 8, 2, 2), ((9,), 12, 320, 64, 8, 4, 2)]


def qmv_exact_stage(r, n, k, staged, rpw=None):
    """qmv-exact.ts's qmv_exact_stage: (XS, RPW). Staged: one row of x a block kept in shared memory, RPW rows
    of w a warp (the fewest powers of two up to 8 that bring the grid to ~512 blocks), unless `rpw` is given."""
    if not staged or r != 1 or k * 2 > 40 * 1024:
        return 0, 1
    if rpw is None:
        rpw = 1
        while rpw < 8 and -(-n // (8 * rpw)) > 512:
            rpw *= 2
    return 1, rpw


def qmv_exact_launch(m, n, k, gs, bits=4, chunks=4, staged=False, rpw=None):
    """qmv-exact.ts's launch: one warp a row of w, 8 a block; up to 7 rows of x a block, else one a grid row;
    `chunks` chunks' loads in flight (QMV_EXACT_CHUNKS); `staged`: the staged launch (qmv_exact_stage)."""
    r = m if m <= 7 else 1
    xs, rpw = qmv_exact_stage(r, n, k, staged, rpw)
    return dict(grid=(-(-n // (8 * rpw)) * 256, m // r, 1), threadgroup=(256, 1, 1),
                template=[("K", k), ("GS", gs), ("R", r), ("BITS", bits), ("CH", chunks), ("XS", xs), ("RPW", rpw), ("GLU", 0)])


def qmv_exact_geglu_launch(m, n, k, gs, bits=4):
    """qmv-exact.ts's qmv_exact_geglu_kernel launch: n rows of w (gate over up), n / 2 outputs, one warp each."""
    r = m if m <= 7 else 1
    return dict(grid=(-(-(n // 2) // 8) * 256, m // r, 1), threadgroup=(256, 1, 1),
                template=[("K", k), ("GS", gs), ("R", r), ("BITS", bits), ("CH", 4), ("XS", 0), ("RPW", 1), ("GLU", 1)])


def qmv_exact_cases(shapes=QMV_EXACT_SHAPES, seed=100):
    for i, (lead, n, k, gs, bits, *rest) in enumerate(shapes):
        ch = rest[0] if rest else 4
        staged = len(rest) > 1
        x, wq, scales, biases = qmv_inputs(lead, n, k, bits, gs, mx.bfloat16, seed + i)
        launch = dict(inputs=[x, wq, scales, biases], output_shapes=[(*lead, n)], output_dtypes=[mx.bfloat16],
                      **qmv_exact_launch(math.prod(lead), n, k, gs, bits, ch, staged=staged, rpw=rest[1] or None if staged else None))
        t = dict(launch["template"])
        yield (f"x{lead} N{n} K{k} {bits}-bit g{gs}" + (f" CH{ch}" if rest else "") + (f" staged RPW{t['RPW']}" if t["XS"] else "")
               + (" (staging declined: several rows of x)" if staged and not t["XS"] else "")), launch, (x, wq, scales, biases, gs, bits)


# GPU only (too large to emulate), against MLX's op: MLX 0.32.4 takes qmm_sm90 only where group_size ≥ K
# (its supports_qmm_sm90), so with M·B < 8 rows it runs its qmv whatever N is: the lm_heads, batched
# rows, and 8-bit at the bench models' widths.
QMV_EXACT_GPU_SHAPES = [((1, 1), 262144, 3840, 64, 4), ((1, 1), 262144, 1536, 64, 4), ((7, 1), 3840, 3840, 64, 4),
                        ((1, 1), 262144, 3840, 64, 4, 8), ((1, 1), 3840, 15360, 64, 4, 8), ((3, 1), 15360, 3840, 64, 4, 2),
                        ((2, 1), 262144, 1536, 64, 4), ((4, 1), 15360, 3840, 64, 4),
                        ((1, 1), 4096, 3840, 64, 8), ((1, 1), 15360, 3840, 64, 8), ((1, 1), 3840, 15360, 64, 8),
                        ((3, 1), 2048, 1536, 32, 8), ((1, 1), 262144, 1536, 64, 8), ((7, 1), 1536, 6144, 128, 8),
                        # the staged launch at the bench models' shapes (RPW by the launch's rule: a 7th field of 0)
                        ((1, 1), 30720, 3840, 64, 4, 4, 0), ((1, 1), 3840, 15360, 64, 4, 4, 0), ((1, 1), 262144, 3840, 64, 4, 8, 0),
                        ((1, 1), 8192, 3840, 64, 4, 4, 0), ((1, 1), 12288, 1536, 64, 4, 4, 0), ((1, 1), 15360, 3840, 64, 8, 4, 0)]


def mlx_op_reference(x, wq, scales, biases, gs, bits):
    """MLX's op where it runs its qmv (fewer than 8 rows); from 8 rows it runs a tiled GEMM instead, so
    the kernel's rows are MLX's op on each row."""
    if math.prod(x.shape[:-1]) < 8:
        return mx.quantized_matmul(x, wq, scales, biases, transpose=True, group_size=gs, bits=bits), "MLX's op"
    rows = x.reshape(-1, 1, x.shape[-1])
    ref = mx.concatenate([mx.quantized_matmul(rows[i], wq, scales, biases, transpose=True, group_size=gs, bits=bits)
                          for i in range(rows.shape[0])])
    return ref.reshape(*x.shape[:-1], wq.shape[0]), "MLX's op row by row"


def check_qmv_exact(k, emulate):
    ok = True
    for label, launch, (x, wq, scales, biases, gs, bits) in qmv_exact_cases():
        out = k(**launch)[0]
        if emulate:
            model = mlx_cuda_qmv_model(x, wq, scales, biases, gs, bits)
            ok = compare(f"mlxb_qmv_exact {label} (MLX CUDA model)", out, model, 0, 0) and ok
            f = mx.float32
            truth = mx.quantized_matmul(x.astype(f), wq, scales.astype(f), biases.astype(f), transpose=True, group_size=gs, bits=bits)
            atol = 0.05 * mx.max(mx.abs(truth)).item()
            ok = compare(f"mlxb_qmv_exact {label} (float32 product, loose)", out, truth, atol, 0) and ok
        else:
            ref, how = mlx_op_reference(x, wq, scales, biases, gs, bits)
            ok = compare(f"mlxb_qmv_exact {label} ({how}, bit for bit)", out, ref, 0, 0) and ok
    if not emulate:
        # A stack taller than MLX's qmv bound (the 12B's gate/up, 2 × 15360 rows; fused-linear.ts): each
        # part's rows as MLX's op gives them for that part alone, and as MLX's op on the whole stack.
        x, wq, scales, biases = qmv_inputs((1, 1), 30720, 3840, 4, 64, mx.bfloat16, 190)
        out = k(inputs=[x, wq, scales, biases], output_shapes=[(1, 1, 30720)], output_dtypes=[mx.bfloat16],
                **qmv_exact_launch(1, 30720, 3840, 64))[0]
        ref = mx.concatenate([mx.quantized_matmul(x, wq[r:r + 15360], scales[r:r + 15360], biases[r:r + 15360], transpose=True,
                                                  group_size=64, bits=4) for r in (0, 15360)], axis=-1)
        ok = compare("mlxb_qmv_exact N30720 = 2 × 15360 K3840 g64 (MLX's op per part, bit for bit)", out, ref, 0, 0) and ok
        whole = mx.quantized_matmul(x, wq, scales, biases, transpose=True, group_size=64, bits=4)
        ok = compare("mlxb_qmv_exact N30720 K3840 g64 (MLX's op on the whole stack, bit for bit)", out, whole, 0, 0) and ok
        for label, launch, (x, wq, scales, biases, gs, bits) in qmv_exact_cases(QMV_EXACT_GPU_SHAPES, 191):
            ref, how = mlx_op_reference(x, wq, scales, biases, gs, bits)
            ok = compare(f"mlxb_qmv_exact {label} ({how}, bit for bit)", k(**launch)[0], ref, 0, 0) and ok
    return ok


# (x leading shape, rows of the gate (and of the up) part, K, group, bits): the gate/up matvec with
# mlx-lm's GeGLU after it (mlxb_qmv_exact_geglu). Emulated: small stacks, ragged parts, several rows.
QMV_GEGLU_SHAPES = [((1,), 24, 512, 64, 4), ((1, 1), 13, 1024, 32, 4), ((3,), 16, 640, 64, 4), ((1,), 10, 256, 64, 8)]
# On a GPU: the 12B's gate/up (2 × 15,360 over 3,840), the 1B's (2 × 6,144 over 1,152 ... 1,536), rows of x.
QMV_GEGLU_GPU_SHAPES = [((1, 1), 15360, 3840, 64, 4), ((1, 1), 6144, 1536, 64, 4), ((3, 1), 15360, 3840, 64, 4), ((1, 1), 2048, 1536, 64, 8)]


def bf16_round(a):
    """float32 values rounded to bf16 (round to nearest even), as float32."""
    return np.array(mx.array(np.asarray(a, np.float32)).astype(mx.bfloat16).astype(mx.float32))


def geglu_cuda_model(g, u):
    """mlx-lm's geglu as mlxb_geglu_exact computes it: every op on bf16 values, rounded to bf16, in the
    order of MLX's compiled tape; libm's powf and tanhf stand in for CUDA's (as the emulator's functors)."""
    g, u = (np.array(a.astype(mx.float32)) for a in (g, u))
    c = lambda v: bf16_round(np.float32(v))
    powv = np.vectorize(lambda a: LIBM.powf(float(a), 3.0), otypes=[np.float32])
    tanhv = np.vectorize(lambda a: LIBM.tanhf(float(a)), otypes=[np.float32])
    cube = bf16_round(c(0.044715) * bf16_round(powv(g)))
    inner = bf16_round(c(0.7978845608028654) * bf16_round(g + cube))
    gelu = bf16_round(bf16_round(c(0.5) * g) * bf16_round(c(1.0) + bf16_round(tanhv(inner))))
    return mx.array(bf16_round(gelu * u)).astype(mx.bfloat16)


def mlx_lm_geglu():
    """mlx-lm's gemma4_text.geglu: gelu_approx(gate) · x, compiled shapeless."""
    import mlx.nn as nn
    return mx.compile(lambda gate, x: nn.gelu_approx(gate) * x, shapeless=True)


def geglu_parts_kernels(spec):
    """The GLU form returning its gate row or its up row instead of their GeGLU: where the launch
    disagrees with MLX (twelfth session), these say whether the row pairing or the GeGLU's arithmetic does."""
    out = {}
    for part in ("gate", "up"):
        v = json.loads(json.dumps(spec))
        v["cuda"]["header"] = v["cuda"]["header"].replace("return mlxb_geglu_exact(gate, up);", f"return {part};")
        assert v["cuda"]["header"] != spec["cuda"]["header"], "the GLU form's output function moved"
        out[part] = compiled(v, False)
    return out


def check_qmv_exact_geglu(k, emulate, spec=None):
    ok = True
    geglu = None if emulate else mlx_lm_geglu()
    parts_k = None if emulate else geglu_parts_kernels(spec)
    for i, (lead, f, kk, gs, bits) in enumerate(QMV_GEGLU_SHAPES if emulate else QMV_GEGLU_GPU_SHAPES):
        x, wq, scales, biases = qmv_inputs(lead, 2 * f, kk, bits, gs, mx.bfloat16, 230 + i)
        out = k(inputs=[x, wq, scales, biases], output_shapes=[(*lead, f)], output_dtypes=[mx.bfloat16],
                **qmv_exact_geglu_launch(math.prod(lead), 2 * f, kk, gs, bits))[0]
        label = f"x{lead} gate/up 2 × {f} K{kk} {bits}-bit g{gs}"
        if emulate:
            both = mlx_cuda_qmv_model(x, wq, scales, biases, gs, bits)
            ok = compare(f"mlxb_qmv_exact_geglu {label} (MLX CUDA model)", out, geglu_cuda_model(both[..., :f], both[..., f:]), 0, 0) and ok
        else:
            parts = [mlx_op_reference(x, wq[r:r + f], scales[r:r + f], biases[r:r + f], gs, bits)[0] for r in (0, f)]
            ok = compare(f"mlxb_qmv_exact_geglu {label} (MLX's op per part, mlx-lm's compiled geglu, bit for bit)", out,
                         geglu(*parts), 0, 0) and ok
            launch = qmv_exact_geglu_launch(math.prod(lead), 2 * f, kk, gs, bits)
            for j, name in enumerate(("gate", "up")):
                row = parts_k[name](inputs=[x, wq, scales, biases], output_shapes=[(*lead, f)], output_dtypes=[mx.bfloat16], **launch)[0]
                ok = compare(f"  its {name} row alone (MLX's op on the {name} part, bit for bit)", row, parts[j], 0, 0) and ok
            # Informational: mlx-lm's compiled geglu against the float model of its tape (libm's powf, tanhf).
            compare(f"  mlx-lm's compiled geglu against the tape's float model (libm), informational", geglu(*parts),
                    geglu_cuda_model(*parts), 0, 0)
    return ok


# ----------------------------------------------------------------------------- decode attention at MLX's rounding points
# packages/mlx-ops/src/kernels/sdpa-decode.ts: q·kᵀ rounded to the dtype, then the precise softmax
# (rounded) · v, at the rounding points of MLX's composition of attention for heads over 128. The
# reference is that composition with each product summed in float32 on the CPU and rounded once (the
# kernels' float32 sums run in another order, so a value may move by one unit in the last place):
# each output within one such unit, and the share of values that differ at all at most
# SDPA_DECODE_MAX_DIFFERING (all-float32 attention, which skips the two roundings, differs in about
# 45% of bf16 outputs, and in 16% with the scores' rounding alone). MLX's own composition on a GPU is
# reported beside it, not gated: where one batch row has one KV head it multiplies the query heads as
# one matrix and cuBLAS may add split parts in the dtype (16% of values differ there; elsewhere
# ~0.01-0.1%, float32 order; tools/kernels/sdpa_decode_sweep.py, docs/custom-kernels.md).
SDPA_DECODE_MAX_KEYS = 1024
SDPA_DECODE_MAX_DIFFERING = 0.02
# (B, Hq, Hkv, D, T, dtype): the 12B's sliding and full layers, the 1B's full layer at the key limit,
# fp16 GQA with two rows, one key, two rows of 8 query heads a KV head (the kernels take bf16 and
# fp16 only: in float32 there are no roundings to keep).
SDPA_DECODE_SHAPES = [(1, 16, 8, 256, 77, mx.bfloat16), (1, 16, 1, 512, 100, mx.bfloat16),
                      (1, 8, 1, 256, SDPA_DECODE_MAX_KEYS, mx.bfloat16), (2, 4, 2, 256, 33, mx.float16),
                      (1, 2, 1, 512, 1, mx.bfloat16), (2, 16, 2, 256, 513, mx.bfloat16)]


def ulp_compare(label, out, ref, dt, gate=True):
    """Within one unit in the last place of dt (relative 2^-7 bf16, 2^-10 fp16), and few values differing."""
    rel = {mx.bfloat16: 2**-7, mx.float16: 2**-10}[dt]
    o, r = out.astype(mx.float32), ref.astype(mx.float32)
    differing = mx.mean((o != r).astype(mx.float32)).item()
    if not gate:
        print(f"{label}: {differing:.2%} of values differ (reported, not checked)", flush=True)
        return True
    tiny = {mx.bfloat16: 1e-38, mx.float16: 6e-8}[dt]
    ok = compare(label, out, ref, tiny, rel)
    print(f"{label}: {differing:.2%} of values differ (at most {SDPA_DECODE_MAX_DIFFERING:.0%})", flush=True)
    return ok and differing <= SDPA_DECODE_MAX_DIFFERING


def sdpa_decode_scores(ks, q, kf, hkv):
    """The scores kernel as sdpa-decode.ts launches it: [B, Hq, T] (the first T of its fixed buffer)."""
    b, hq, _, d = q.shape
    tmpl = [("T", q.dtype), ("D", d), ("REP", hq // hkv), ("WARPS", 8), ("TOK", 32), ("MAXK", SDPA_DECODE_MAX_KEYS)]
    s = ks(inputs=[q, kf], template=tmpl, grid=(SDPA_DECODE_MAX_KEYS // 32 * 256, b * hkv, 1), threadgroup=(256, 1, 1),
           output_shapes=[(b, hq, SDPA_DECODE_MAX_KEYS)], output_dtypes=[q.dtype])[0]
    return s[:, :, : kf.t]


def sdpa_decode_values(kv, s, vf, hkv):
    """The values kernel as sdpa-decode.ts launches it, on scores [B, Hq, T] padded to its buffer: [B, Hq, 1, D]."""
    b, hq, t = s.shape
    d = vf.full.shape[-1]
    tmpl = [("T", s.dtype), ("DV", d), ("REP", hq // hkv), ("WARPS", 8), ("CHUNK", 64)]
    return kv(inputs=[mx.pad(s, [(0, 0), (0, 0), (0, SDPA_DECODE_MAX_KEYS - t)]), vf], template=tmpl, grid=(d // 64 * 256, b * hq, 1),
              threadgroup=(256, 1, 1), output_shapes=[(b, hq, 1, d)], output_dtypes=[s.dtype])[0]


def sdpa_decode_score_refs(q, kf, hkv):
    """MLX's composition's q·kᵀ (GQA as fast.cpp's fallback: q [B, Hkv, rep, 1, D]) on this device, and
    the same product summed in float32 on the CPU, rounded once: [B, Hq, T] each."""
    b, hq, _, d = q.shape
    qg = q.reshape(b, hkv, hq // hkv, 1, d)
    ke = mx.expand_dims(kf.mx, 2).swapaxes(-1, -2)
    s_mlx = (qg @ ke).reshape(b, hq, kf.t)
    with mx.stream(mx.cpu):
        s_f32 = (qg.astype(mx.float32) @ ke.astype(mx.float32)).reshape(b, hq, kf.t).astype(q.dtype)
    return s_mlx, s_f32


def sdpa_decode_value_refs(s, vf, hkv):
    """MLX's precise softmax of scores s [B, Hq, T] on this device, then p·v as MLX multiplies it and
    summed in float32 on the CPU, rounded once: [B, Hq, 1, D] each."""
    b, hq, t = s.shape
    d = vf.full.shape[-1]
    p = mx.softmax(s, axis=-1, precise=True).reshape(b, hkv, hq // hkv, 1, t)
    ve = mx.expand_dims(vf.mx, 2)
    o_mlx = (p @ ve).reshape(b, hq, 1, d)
    with mx.stream(mx.cpu):
        o_f32 = (p.astype(mx.float32) @ ve.astype(mx.float32)).reshape(b, hq, 1, d).astype(s.dtype)
    return o_mlx, o_f32


def check_sdpa_decode(ks, kv, emulate):
    ok = True
    for i, (b, hq, hkv, d, t, dt) in enumerate(SDPA_DECODE_SHAPES):
        mx.random.seed(300 + i)
        q = mx.random.normal((b, hq, 1, d)).astype(dt)
        # Keys and values as the cache holds them: the first t tokens of a longer buffer (strided views).
        kf = Sliced(mx.random.normal((b, hkv, t + 13, d)).astype(dt), t)
        vf = Sliced(mx.random.normal((b, hkv, t + 13, d)).astype(dt), t)
        label = f"B{b} Hq{hq} Hkv{hkv} D{d} T{t} {str(dt).split('.')[-1]}"
        s = sdpa_decode_scores(ks, q, kf, hkv)
        s_mlx, s_ref = sdpa_decode_score_refs(q, kf, hkv)
        ok = ulp_compare(f"mlxb_sdpa_decode_scores {label} (q·kᵀ, float32, rounded)", s, s_ref, dt) and ok
        if not emulate:
            ulp_compare(f"mlxb_sdpa_decode_scores {label} (MLX's matmul)", s, s_mlx, dt, gate=False)
        o = sdpa_decode_values(kv, s_ref, vf, hkv)
        o_mlx, o_ref = sdpa_decode_value_refs(s_ref, vf, hkv)
        ok = ulp_compare(f"mlxb_sdpa_decode_values {label} (MLX's softmax, p·v float32, rounded)", o, o_ref, dt) and ok
        if not emulate:
            ulp_compare(f"mlxb_sdpa_decode_values {label} (MLX's softmax and matmul)", o, o_mlx, dt, gate=False)
            e2e = sdpa_decode_values(kv, s, vf, hkv)
            ref = mx.fast.scaled_dot_product_attention(q, kf.mx, vf.mx, scale=1.0)
            ulp_compare(f"mlxb_sdpa_decode end to end {label} (MLX's scaled_dot_product_attention)", e2e, ref, dt, gate=False)
    return ok


# ----------------------------------------------------------------------------- fused exact norms
# packages/mlx-ops/src/kernels/norm-exact.ts: MLX's CUDA RMSNorm arithmetic (docs/custom-kernels.md,
# "MLX's CUDA RMSNorm, as compiled") fused with its neighbours. On a GPU the reference is MLX's own
# ops (rms_norm, add, multiply) at zero tolerance; in the emulator, a model of rms_norm_small written
# from its SASS (below) at zero tolerance, with 1/sqrt standing in for MUFU.RSQ on both sides.


def mlx_norm_partition(a):
    """rms_norm.cu's dispatch_num_chunks for bf16 (8 values a thread): (threads a block, vectors a thread)."""
    nvec = -(-a // 8)
    if a <= 8 * 64:
        return 64, 1
    if nvec % 128 == 0 and nvec // 128 <= 8:
        return 128, nvec // 128
    if nvec % 64 == 0 and nvec // 64 <= 8:
        return 64, nvec // 64
    return 128, min(8, -(-nvec // 128))


def mlx_norm_threads(a):
    """norm-exact.ts norm_threads: a fused norm block's threads (one value each, at least MLX's BLOCK, at most 512)."""
    return max(mlx_norm_partition(a)[0], min(512, -(-a // 32) * 32))


def butterfly(v):
    """cg::reduce over a warp as compiled: SHFL.BFLY 16, 8, 4, 2, 1, each v + partner (float32)."""
    for off in (16, 8, 4, 2, 1):
        v = v + v[..., np.arange(32) ^ off]
    return v


def mlx_cuda_rms_model(x, w, eps):
    """rms_norm_small<bf16, BLOCK, CHUNKS, *, 8>: x mx bf16 [..., A], w mx bf16 [A] or None."""
    a = x.shape[-1]
    block, chunks = mlx_norm_partition(a)
    xs = np.array(x.astype(mx.float32)).reshape(-1, a)
    rows = xs.shape[0]
    pad = np.zeros((rows, block * chunks * 8), np.float32)
    pad[:, :a] = xs
    vals = pad.reshape(rows, chunks, block, 8)
    acc = np.zeros((rows, block), np.float32)
    for i in range(chunks):
        for j in range(8):
            v = vals[:, i, :, j].astype(np.float64)
            # FFMA: acc + v² rounded once (exact in float64 for these inputs' spread of exponents).
            acc = (v * v + acc.astype(np.float64)).astype(np.float32)
    warps = butterfly(acc.reshape(rows, block // 32, 32))[..., 0]
    if block > 32:
        lanes = np.zeros((rows, 32), np.float32)
        lanes[:, : block // 32] = warps
        total = butterfly(lanes)[:, 0]
    else:
        total = warps[:, 0]
    r = np.float32(1) / np.sqrt(total / np.float32(a) + np.float32(eps))
    y = mx.array(xs * r[:, None]).astype(mx.bfloat16)
    if w is not None:
        y = mx.array(np.array(y.astype(mx.float32)) * np.array(w.astype(mx.float32))[None]).astype(mx.bfloat16)
    return y.reshape(x.shape)


def eps_bits(eps):
    return int(np.array([eps], np.float32).view(np.int32)[0])


LIBM = ctypes.CDLL(ctypes.util.find_library("m"))
for _f in ("cosf", "sinf", "exp2f", "tanhf"):
    getattr(LIBM, _f).restype = ctypes.c_float
    getattr(LIBM, _f).argtypes = [ctypes.c_float]
LIBM.powf.restype = ctypes.c_float
LIBM.powf.argtypes = [ctypes.c_float, ctypes.c_float]


def f32_fma(a, b, c):
    """fma in float32 through float64 (a bf16 times a float32 is exact there; the sum is for these inputs)."""
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


def mlx_cuda_rope_model(x, dims, base, freqs, scale, offset):
    """rope_single / rope_single_freqs<bf16, false, true> on x mx bf16 [..., D] (one position), as read
    from their SASS: IEEE p / half, exp2f(-(d·log2 base)) or 1/freq, theta = (scale·offset)·inv,
    cosf, sinf, x2's product rounded, x1's fused; the C library's cosf/sinf/exp2f stand in for CUDA's."""
    half = dims // 2
    xs = np.array(x.astype(mx.float32))
    pos = np.float32(scale) * np.float32(offset)
    log2b = np.float32(math.log2(np.float32(base))) if base is not None else None
    fr = None if freqs is None else np.array(freqs)
    c, s_ = np.zeros(half, np.float32), np.zeros(half, np.float32)
    for p in range(half):
        if base is not None:
            d = np.float32(p) / np.float32(half)
            inv = np.float32(LIBM.exp2f(float(-(d * log2b))))
        else:
            inv = np.float32(1) / np.float32(fr[p])
        theta = np.float32(pos * inv)
        c[p], s_[p] = LIBM.cosf(float(theta)), LIBM.sinf(float(theta))
    x1, x2 = xs[..., :half], xs[..., half:dims]
    out = xs.copy()
    out[..., :half] = f32_fma(x1, c, -(x2 * s_))
    out[..., half:dims] = f32_fma(x1, s_, x2 * c)
    return mx.array(out).astype(mx.bfloat16)


def bf16(a):
    return mx.array(a).astype(mx.bfloat16)


# (hq, hk, hv, dim, rope dims, base or None for freqs, scale, offset): the 12B's sliding layers (θ 10⁴)
# and full layers (proportional: freqs, a quarter rotated, the rest inf), partial rotation, a scale.
QKV_ROPE_SHAPES = [(16, 8, 8, 256, 256, 10000.0, 1.0, 37), (32, 4, 0, 512, 512, None, 1.0, 1234), (4, 2, 2, 128, 64, 1e6, 0.5, 5)]


def proportional_freqs(dims, base=1e6, rotated_fraction=0.25):
    rot = int(dims * rotated_fraction) // 2 * 2
    exps = np.arange(0, rot, 2, dtype=np.float32) / np.float32(dims)
    f = np.full(dims // 2, np.inf, np.float32)
    f[: rot // 2] = np.float32(base) ** exps
    return mx.array(f)


def qkv_rope_cases():
    for i, (hq, hk, hv, dim, rd, base, scale, offset) in enumerate(QKV_ROPE_SHAPES):
        mx.random.seed(350 + i)
        x = (mx.random.normal((1, 1, (hq + hk + hv) * dim)) * 3).astype(mx.bfloat16)
        qw = (1 + 0.5 * mx.random.normal((dim,))).astype(mx.bfloat16)
        kw = (1 + 0.5 * mx.random.normal((dim,))).astype(mx.bfloat16)
        off = mx.array([offset], dtype=mx.int32)
        freqs = proportional_freqs(rd) if base is None else None
        block, chunks = mlx_norm_partition(dim)
        wide = mlx_norm_threads(dim)
        log2b = float(np.float32(math.log2(np.float32(base)))) if base is not None else 1.0
        launch = dict(inputs=[x, qw, kw, off, freqs if freqs is not None else qw],
                      output_shapes=[(1, hq, 1, dim), (1, hk, 1, dim), (1, hk, 1, dim)],
                      output_dtypes=[mx.bfloat16] * 3, grid=((hq + 2 * hk) * wide, 1, 1), threadgroup=(wide, 1, 1),
                      template=[("HQ", hq), ("HK", hk), ("HV", hv), ("A", dim), ("WIDE", wide), ("BLOCK", block), ("CHUNKS", chunks),
                                ("EPS_BITS", eps_bits(NORM_EPS)), ("ROPE", 1 if base is not None else 2), ("RD", rd),
                                ("SCALE_BITS", eps_bits(scale)), ("BASE_BITS", eps_bits(log2b))])
        parts = mx.split(x, [hq * dim, (hq + hk) * dim], axis=-1)
        q0 = parts[0].reshape(1, 1, hq, dim)
        k0 = parts[1].reshape(1, 1, hk, dim)
        v0 = (parts[2] if hv else parts[1]).reshape(1, 1, hk, dim)
        label = f"heads {hq}/{hk}/{hv or 'k'} dim {dim} rope {rd} {'base ' + str(base) if base else 'freqs'} scale {scale} at {offset}"
        yield label, launch, ((q0, qw), (k0, kw), (v0, None)), (rd, base, freqs, scale, off)


def check_qkv_rope(k, emulate):
    ok = True
    for label, launch, parts, (rd, base, freqs, scale, off) in qkv_rope_cases():
        outs = k(**launch)
        for i, (name, out, (x, w)) in enumerate(zip("qkv", outs, parts)):
            if emulate:
                n = mlx_cuda_rms_model(x, w, NORM_EPS).transpose(0, 2, 1, 3)
                ref = n if i == 2 else mlx_cuda_rope_model(n, rd, base, freqs, scale, int(off.item()))
                how = "MLX CUDA model"
            else:
                n = mx.fast.rms_norm(x, w, NORM_EPS).transpose(0, 2, 1, 3)
                ref = n if i == 2 else mx.fast.rope(n, rd, traditional=False, base=base, scale=scale, offset=off, freqs=freqs)
                how = "MLX's rms_norm and rope, bit for bit"
            ok = compare(f"mlxb_qkv_norm_exact {label} {name} ({how})", out, ref, 0, 0) and ok
    return ok


# (lead, hq, hk, hv, dim): the 12B's sliding (16/8/8 × 256) and full (k = v, 512) layers, small ones.
QKV_NORM_SHAPES = [((1, 1), 16, 8, 8, 256), ((1, 1), 32, 4, 0, 512), ((2,), 4, 1, 1, 128), ((1,), 3, 2, 0, 1152)]
# (rows, A, scaled, y offset): hidden 3840 (BLOCK 128 × 4, a partial last chunk), 1152, 1536, 2560,
# 5376, 8192, 256; 1004 (not a multiple of 8). With a y offset of 1, y starts one value into its
# buffer (a contiguous view the kernel gets as is, not 16-byte aligned: what a kernel with vector
# loads must handle).
RESIDUAL_NORM_SHAPES = [(1, 3840, True, 0), (1, 3840, False, 0), (3, 1152, True, 0), (1, 1536, False, 0), (2, 2560, True, 0),
                        (1, 5376, True, 0), (1, 8192, False, 0), (1, 256, True, 0), (2, 1004, True, 0), (1, 3840, True, 1)]
NORM_EPS = 1e-6


def qkv_norm_cases():
    for i, (lead, hq, hk, hv, dim) in enumerate(QKV_NORM_SHAPES):
        mx.random.seed(300 + i)
        x = (mx.random.normal((*lead, (hq + hk + hv) * dim)) * 3).astype(mx.bfloat16)
        qw = (1 + 0.5 * mx.random.normal((dim,))).astype(mx.bfloat16)
        kw = (1 + 0.5 * mx.random.normal((dim,))).astype(mx.bfloat16)
        block, chunks = mlx_norm_partition(dim)
        wide = mlx_norm_threads(dim)
        rows = math.prod(lead)
        launch = dict(inputs=[x, qw, kw, qw, qw], output_shapes=[(*lead, hq, dim), (*lead, hk, dim), (*lead, hk, dim)],
                      output_dtypes=[mx.bfloat16] * 3, grid=(rows * (hq + 2 * hk) * wide, 1, 1), threadgroup=(wide, 1, 1),
                      template=[("HQ", hq), ("HK", hk), ("HV", hv), ("A", dim), ("WIDE", wide), ("BLOCK", block), ("CHUNKS", chunks),
                                ("EPS_BITS", eps_bits(NORM_EPS)), ("ROPE", 0), ("RD", 2), ("SCALE_BITS", eps_bits(1.0)),
                                ("BASE_BITS", eps_bits(1.0))])
        parts = mx.split(x, [hq * dim, (hq + hk) * dim], axis=-1)
        q0 = parts[0].reshape(*lead, hq, dim)
        k0 = parts[1].reshape(*lead, hk, dim)
        v0 = (parts[2] if hv else parts[1]).reshape(*lead, hk, dim)
        yield f"x{lead} heads {hq}/{hk}/{hv or 'k'} dim {dim}", launch, ((q0, qw), (k0, kw), (v0, None))


def residual_norm_cases():
    for i, (rows, a, scaled, y_offset) in enumerate(RESIDUAL_NORM_SHAPES):
        mx.random.seed(400 + i)
        h = (mx.random.normal((rows, a)) * 4).astype(mx.bfloat16)
        y = (mx.random.normal((rows, a)) * 20).astype(mx.bfloat16)
        if y_offset:
            y = (mx.random.normal((rows * a + y_offset,)) * 20).astype(mx.bfloat16)[y_offset:].reshape(rows, a)
        pw = (1 + 0.5 * mx.random.normal((a,))).astype(mx.bfloat16)
        nw = (1 + 0.5 * mx.random.normal((a,))).astype(mx.bfloat16)
        scale = mx.array([0.37]).astype(mx.bfloat16)
        block, chunks = mlx_norm_partition(a)
        wide = mlx_norm_threads(a)
        launch = dict(inputs=[h, y, pw, nw, scale], output_shapes=[(rows, a), (rows, a)], output_dtypes=[mx.bfloat16] * 2,
                      grid=(rows * wide, 1, 1), threadgroup=(wide, 1, 1),
                      template=[("A", a), ("WIDE", wide), ("BLOCK", block), ("CHUNKS", chunks), ("EPS_BITS", eps_bits(NORM_EPS)),
                                ("HAS_SCALE", scaled)])
        yield (f"rows {rows} A {a} {'scaled' if scaled else 'unscaled'}{f', y offset {y_offset}' if y_offset else ''}", launch,
               (h, y, pw, nw, scale if scaled else None))


def check_qkv_norm(k, emulate):
    ok = True
    for label, launch, parts in qkv_norm_cases():
        outs = k(**launch)
        for name, out, (x, w) in zip("qkv", outs, parts):
            if emulate:
                ref, how = mlx_cuda_rms_model(x, w, NORM_EPS), "MLX CUDA model"
            else:
                ref, how = mx.fast.rms_norm(x, w, NORM_EPS), "MLX's rms_norm, bit for bit"
            ok = compare(f"mlxb_qkv_norm_exact {label} {name} ({how})", out, ref, 0, 0) and ok
    return check_qkv_rope(k, emulate) and ok


# (hq, dim, rope dims or 0, base or None for freqs, scale, offset): a KV-sharing layer's queries, sliding
# (θ 10⁴) and full (proportional freqs), and without RoPE over two rows.
Q_NORM_SHAPES = [(8, 256, 256, 10000.0, 1.0, 37), (8, 512, 512, None, 1.0, 1234), (3, 128, 0, None, 1.0, 0)]


def check_q_norm(k, emulate):
    ok = True
    for i, (hq, dim, rd, base, scale, offset) in enumerate(Q_NORM_SHAPES):
        mx.random.seed(500 + i)
        rows = 1 if rd else 2
        x = (mx.random.normal((rows, 1, hq * dim)) * 3).astype(mx.bfloat16)
        qw = (1 + 0.5 * mx.random.normal((dim,))).astype(mx.bfloat16)
        off = mx.array([offset], dtype=mx.int32)
        freqs = proportional_freqs(rd) if rd and base is None else None
        block, chunks = mlx_norm_partition(dim)
        wide = mlx_norm_threads(dim)
        log2b = float(np.float32(math.log2(np.float32(base)))) if base is not None else 1.0
        rope = 0 if not rd else (1 if base is not None else 2)
        shape = (1, hq, 1, dim) if rd else (rows, 1, hq, dim)
        (out,) = k(inputs=[x, qw, off if rd else qw, freqs if freqs is not None else qw], output_shapes=[shape],
                   output_dtypes=[mx.bfloat16], grid=(rows * hq * wide, 1, 1), threadgroup=(wide, 1, 1),
                   template=[("A", dim), ("WIDE", wide), ("BLOCK", block), ("CHUNKS", chunks), ("EPS_BITS", eps_bits(NORM_EPS)), ("ROPE", rope),
                             ("RD", rd or 2), ("SCALE_BITS", eps_bits(scale)), ("BASE_BITS", eps_bits(log2b))])
        q0 = x.reshape(rows, 1, hq, dim)
        if emulate:
            n = mlx_cuda_rms_model(q0, qw, NORM_EPS)
            ref = mlx_cuda_rope_model(n.transpose(0, 2, 1, 3), rd, base, freqs, scale, offset) if rd else n
            how = "MLX CUDA model"
        else:
            n = mx.fast.rms_norm(q0, qw, NORM_EPS)
            ref = mx.fast.rope(n.transpose(0, 2, 1, 3), rd, traditional=False, base=base, scale=scale, offset=off, freqs=freqs) if rd else n
            how = "MLX's rms_norm and rope, bit for bit" if rd else "MLX's rms_norm, bit for bit"
        label = f"heads {hq} dim {dim} " + (f"rope {rd} {'base ' + str(base) if base else 'freqs'} at {offset}" if rd else f"rows {rows}, no rope")
        ok = compare(f"mlxb_q_norm_exact {label} ({how})", out, ref, 0, 0) and ok
    return ok


def residual_sum_model(h, y, pw, scale, emulate):
    """h + rms_norm(y, pw), times scale where given: MLX's ops, or in the emulator their CUDA model."""
    if not emulate:
        s = mx.add(h, mx.fast.rms_norm(y, pw, NORM_EPS))
        return s if scale is None else mx.multiply(s, scale)
    yn = mlx_cuda_rms_model(y, pw, NORM_EPS)
    s = bf16(np.array(h.astype(mx.float32)) + np.array(yn.astype(mx.float32)))
    return s if scale is None else bf16(np.array(s.astype(mx.float32)) * np.array(scale.astype(mx.float32)))


def check_residual(k, emulate):
    """mlxb_residual_exact: the residual point without the next norm (the cases of the fused one)."""
    ok = True
    how = "MLX CUDA model" if emulate else "MLX's ops, bit for bit"
    for label, launch, (h, y, pw, nw, scale) in residual_norm_cases():
        ins = launch["inputs"]
        (h_out,) = k(**{**launch, "inputs": [ins[0], ins[1], ins[2], ins[4]], "output_shapes": launch["output_shapes"][:1],
                        "output_dtypes": launch["output_dtypes"][:1]})
        ok = compare(f"mlxb_residual_exact {label} sum ({how})", h_out, residual_sum_model(h, y, pw, scale, emulate), 0, 0) and ok
    return ok


def check_residual_norm(k, emulate):
    ok = True
    for label, launch, (h, y, pw, nw, scale) in residual_norm_cases():
        h_out, n_out = k(**launch)
        s = residual_sum_model(h, y, pw, scale, emulate)
        if emulate:
            n, how = mlx_cuda_rms_model(s, nw, NORM_EPS), "MLX CUDA model"
        else:
            n, how = mx.fast.rms_norm(s, nw, NORM_EPS), "MLX's ops, bit for bit"
        ok = compare(f"mlxb_residual_norm_exact {label} sum ({how})", h_out, s, 0, 0) and ok
        ok = compare(f"mlxb_residual_norm_exact {label} norm ({how})", n_out, n, 0, 0) and ok
    return ok


CASES = {"mlxb_geglu": geglu_cases, "mlxb_turbo_values": turbo_values_cases, "mlxb_qmv": qmv_cases}
DECODE = {"mlxb_affine_decode_partials": affine_cases, "mlxb_turbo_decode_partials": turbo_cases, "mlxb_dense_decode_partials": dense_cases}


# ----------------------------------------------------------------------------- running a body

CUDA_TYPES = {mx.float32: "float", mx.bfloat16: "__nv_bfloat16", mx.float16: "__half", mx.uint32: "uint32_t",
              mx.uint8: "uint8_t", mx.bool_: "bool", mx.int32: "int32_t"}


def host_bytes(a):
    a = mx.contiguous(a)
    if a.dtype in (mx.bfloat16, mx.float16):
        a = a.view(mx.uint16)
    return np.ascontiguousarray(np.array(a)).tobytes()


def kernel_params(spec, in_types, out_types):
    """The parameters of the kernel MLX's cuda_kernel generates for a body: each input as a const
    pointer of its C++ type, followed by its shape / strides / ndim where the body names them, then
    the outputs (ptxas_regs.py compiles bodies inside the same signature)."""
    src, params = spec["cuda"]["source"], []
    for n, ty in zip(spec["input_names"], in_types):
        params.append(f"const {ty}* {n}")
        for suffix, aux in (("_shape", "Shape"), ("_strides", "Strides"), ("_ndim", "int")):
            if n + suffix in src:
                params.append(f"const __grid_constant__ {aux} {n}{suffix}")
    return params + [f"{ty}* {n}" for n, ty in zip(spec["output_names"], out_types)]


class Emulated:
    """A kernel body compiled with g++ on cuda_emu.h inside the signature MLX generates."""

    cache = {}

    def __init__(self, spec):
        self.spec, self.src = spec, spec["cuda"]["source"]
        self.ensure_contiguous = spec.get("ensure_row_contiguous", True)

    def _binary(self, inputs, template, out_dtypes):
        names, src = self.spec["input_names"], self.src
        params = kernel_params(self.spec, [CUDA_TYPES[a.dtype] for a in inputs], [CUDA_TYPES[d] for d in out_dtypes])
        consts = "".join(f"  using {k} = {CUDA_TYPES[v]};\n" if isinstance(v, mx.Dtype) else
                         f"  constexpr {'bool' if isinstance(v, bool) else 'int'} {k} = {str(v).lower() if isinstance(v, bool) else v};\n"
                         for k, v in template)
        args, decl = [], []
        for i, (n, a) in enumerate(zip(names, inputs)):
            args.append(f"reinterpret_cast<const {CUDA_TYPES[a.dtype]}*>(in[{i}].data.data())")
            for suffix, field in (("_shape", "shape"), ("_strides", "strides"), ("_ndim", "ndim")):
                if n + suffix in src:
                    args.append(f"in[{i}].{field}")
        for j, d in enumerate(out_dtypes):
            args.append(f"reinterpret_cast<{CUDA_TYPES[d]}*>(out[{j}].data())")
        header = self.spec["cuda"].get("header") or ""
        code = f"""#include "cuda_emu.h"
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
{header}
namespace mlx::core::cu {{
namespace cg = cooperative_groups;
__global__ void kernel({", ".join(params)}) {{
{consts}
{src}
}}
}}  // namespace mlx::core::cu
struct In {{ std::vector<char> data; Shape shape{{}}; Strides strides{{}}; int ndim = 0; }};
static std::vector<char> slurp(const std::string& p, size_t n) {{
  std::vector<char> v(n); std::ifstream f(p, std::ios::binary); f.read(v.data(), (std::streamsize)n); return v;
}}
int main(int, char** argv) {{
  std::ifstream m(argv[1]);
  dim3 grid, block; m >> grid.x >> grid.y >> grid.z >> block.x >> block.y >> block.z;
  grid.x = (grid.x + block.x - 1) / block.x; grid.y = (grid.y + block.y - 1) / block.y; grid.z = (grid.z + block.z - 1) / block.z;
  std::vector<In> in({len(inputs)});
  for (auto& x : in) {{
    size_t n; std::string path; m >> x.ndim;
    for (int d = 0; d < x.ndim; ++d) m >> x.shape[d];
    for (int d = 0; d < x.ndim; ++d) m >> x.strides[d];
    m >> n >> path; x.data = slurp(path, n);
  }}
  std::vector<std::vector<char>> out({len(out_dtypes)});
  std::vector<std::string> paths(out.size());
  for (size_t j = 0; j < out.size(); ++j) {{ size_t n; m >> n >> paths[j]; out[j].assign(n, 0); }}
  emu_launch(grid, block, [&] {{ mlx::core::cu::kernel({", ".join(args)}); }});
  for (size_t j = 0; j < out.size(); ++j) {{ std::ofstream f(paths[j], std::ios::binary); f.write(out[j].data(), (std::streamsize)out[j].size()); }}
}}
"""
        key = hashlib.sha1(code.encode()).hexdigest()[:16]
        if key not in Emulated.cache:
            d = tempfile.mkdtemp(prefix="cuda-emu-")
            with open(os.path.join(d, "k.cpp"), "w") as f:
                f.write(code)
            exe = os.path.join(d, "k")
            r = subprocess.run(["g++", "-std=c++20", "-O1", "-pthread", "-I", HERE, "-o", exe, os.path.join(d, "k.cpp")],
                               capture_output=True, text=True)
            if r.returncode:
                raise RuntimeError(f"g++ failed for {self.spec['name']}:\n{r.stderr[-4000:]}")
            Emulated.cache[key] = exe
        return Emulated.cache[key]

    def __call__(self, inputs, template, grid, threadgroup, output_shapes, output_dtypes):
        flat = []
        for a in inputs:
            if isinstance(a, Strided) and not self.ensure_contiguous:
                full = mx.contiguous(a.full)  # [B, H, X, T] read as [B, H, t, X]
                b_, h_, x_, t_ = full.shape
                flat.append((full, [b_, h_, a.t, x_], [h_ * x_ * t_, x_ * t_, 1, t_]))
            elif isinstance(a, Sliced) and not self.ensure_contiguous:
                full = mx.contiguous(a.full)
                shape = list(full.shape)
                strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
                shape[2] = a.t
                flat.append((full, shape, strides))
            else:
                x = mx.contiguous(as_mx(a))
                flat.append((x, list(x.shape), [math.prod(x.shape[i + 1:]) for i in range(x.ndim)]))
        exe = self._binary([f[0] for f in flat], template, output_dtypes)
        d = tempfile.mkdtemp(prefix="cuda-emu-run-")
        lines = [" ".join(map(str, (*grid, *threadgroup)))]
        for i, (x, shape, strides) in enumerate(flat):
            data = host_bytes(x)
            path = os.path.join(d, f"in{i}")
            with open(path, "wb") as f:
                f.write(data)
            lines.append(f"{len(shape)} {' '.join(map(str, shape))} {' '.join(map(str, strides))} {len(data)} {path}")
        outs = []
        for j, (s, dt) in enumerate(zip(output_shapes, output_dtypes)):
            path = os.path.join(d, f"out{j}")
            outs.append((path, s, dt))
            lines.append(f"{math.prod(s) * dt.size} {path}")
        with open(os.path.join(d, "manifest"), "w") as f:
            f.write("\n".join(lines) + "\n")
        subprocess.run([exe, os.path.join(d, "manifest")], check=True)
        res = []
        for path, s, dt in outs:
            raw = np.fromfile(path, dtype=np.uint8)
            host = {mx.float32: np.float32, mx.uint32: np.uint32, mx.uint8: np.uint8}.get(dt, np.uint16)
            arr = mx.array(raw.view(host).reshape(s))
            res.append(arr.view(dt) if host is np.uint16 else arr)
        return res


def compiled(spec, emulate):
    if emulate:
        return Emulated(spec)
    k = mx.fast.cuda_kernel(
        name=spec["name"], input_names=spec["input_names"], output_names=spec["output_names"],
        source=spec["cuda"]["source"], header=spec["cuda"].get("header", ""),
        ensure_row_contiguous=spec.get("ensure_row_contiguous", True),
    )
    return lambda inputs, **kw: k(inputs=[as_mx(a) for a in inputs], **kw)


def compare(label, out, ref, atol, rtol):
    r = ref.astype(mx.float32)
    o = out.astype(mx.float32)
    # Equal values match, infinities too (the m of a partial with no tokens is −∞ in both).
    d = mx.where(o == r, 0.0, mx.abs(o - r))
    both_nan = mx.isnan(o) & mx.isnan(r)
    bad = int(mx.sum((~(d <= atol + rtol * mx.abs(r))) & ~both_nan).item())
    print(f"{label}: max |diff| {mx.max(mx.where(both_nan, 0.0, d)).item():.3g}, outside tolerance {bad}", flush=True)
    global COMPARED
    COMPARED += 1
    return bad == 0


COMPARED = 0


def main() -> None:
    args = sys.argv[1:]
    emulate = "--emulate" in args
    only = set(args[args.index("--only") + 1].split(",")) if "--only" in args else None
    match = args[args.index("--match") + 1] if "--match" in args else ""
    quick = "--quick" in args
    specs = {s["name"]: s for s in json.load(open(args[0]))}
    if emulate:
        mx.set_default_device(mx.cpu)
    else:
        assert mx.cuda.is_available(), "no CUDA backend in this MLX"
        mx.set_default_device(mx.gpu)
    ok = True
    for name, spec in specs.items():
        if not spec["cuda"] or name not in CASES or (only and name not in only):
            continue
        k = compiled(spec, emulate)
        for label, launch, refs, tols in CASES[name]():
            outs = k(**launch)
            for i, (o, r, (atol, rtol)) in enumerate(zip(outs, refs, tols)):
                ok = compare(f"{name} {label}" + (f" out{i}" if len(refs) > 1 else ""), o, r, atol, rtol) and ok
    if "mlxb_turbo_encode_values" in specs and (not only or "mlxb_turbo_encode_values" in only):
        ok = check_turbo_encode(compiled(specs["mlxb_turbo_encode_values"], emulate), specs["mlxb_turbo_encode_values"], emulate, quick) and ok
    if "mlxb_qmv_exact" in specs and (not only or "mlxb_qmv_exact" in only):
        ok = check_qmv_exact(compiled(specs["mlxb_qmv_exact"], emulate), emulate) and ok
    if "mlxb_qmv_exact_geglu" in specs and (not only or "mlxb_qmv_exact_geglu" in only):
        ok = check_qmv_exact_geglu(compiled(specs["mlxb_qmv_exact_geglu"], emulate), emulate, specs["mlxb_qmv_exact_geglu"]) and ok
    for name, check in (("mlxb_qkv_norm_exact", check_qkv_norm), ("mlxb_q_norm_exact", check_q_norm),
                        ("mlxb_residual_norm_exact", check_residual_norm), ("mlxb_residual_exact", check_residual)):
        if name in specs and (not only or name in only):
            ok = check(compiled(specs[name], emulate), emulate) and ok
    if "mlxb_sdpa_decode_scores" in specs and (not only or "mlxb_sdpa_decode_scores" in only):
        ok = check_sdpa_decode(compiled(specs["mlxb_sdpa_decode_scores"], emulate), compiled(specs["mlxb_sdpa_decode_values"], emulate), emulate) and ok
    if "mlxb_turbo_unrotate" in specs and (not only or "mlxb_turbo_unrotate" in only):
        ok = check_turbo_unrotate(compiled(specs["mlxb_turbo_unrotate"], emulate), emulate, quick) and ok
    combine = compiled(specs["mlxb_decode_combine"], emulate) if "mlxb_decode_combine" in specs else None
    for name, cases in DECODE.items():
        if name not in specs or (only and name not in only and "mlxb_decode_combine" not in only):
            continue
        k = compiled(specs[name], emulate)
        for c in cases():
            if match not in c.label or (quick and (c.dt != mx.bfloat16 or c.p["t"] > 4096)):
                continue
            p = c.p
            # References on the CPU: float32 matmuls on the GPU may take TF32 (about 1e-3 relative).
            with mx.stream(mx.cpu):
                refs = ref_partials(p, c.qs, c.keys, c.values, c.mask)
                mx.eval(refs)
            outs = k(**c.launch)
            # Pass 1 against its reference: o, m, l.
            for i, (o, r) in enumerate(zip(outs, refs)):
                scale = max(1.0, mx.max(mx.where(mx.isinf(r), 0.0, mx.abs(r))).item())
                ok = compare(f"{name} {c.label} {['o', 'm', 'l'][i]}", o, r, PASS1_TOL[0] * scale, PASS1_TOL[1]) and ok
            # Pass 2 on the reference partials, then both kernels end to end vs float32 attention.
            atol, rtol = TOL[c.dt]
            with mx.stream(mx.cpu):
                ref_out = ref_combine(*refs, p["b"], p["hq"], c.dt)
                truth = sdpa_truth(c.qs, c.keys, c.values, c.mask)
                mx.eval(ref_out, truth)
            got = combine(inputs=[*refs, c.qs], **combine_launch(p, c.dt))[0]
            ok = compare(f"mlxb_decode_combine {c.label}", got, ref_out, atol, rtol) and ok
            e2e = combine(inputs=[*outs, c.qs], **combine_launch(p, c.dt))[0]
            scale = max(1e-3, mx.max(mx.abs(truth)).item())
            ok = compare(f"end to end {name} {c.label}", e2e, truth.astype(c.dt), 1e-5 * scale, rtol) and ok
    if COMPARED == 0:
        print("no case matched")
        ok = False
    print(f"RESULT {'PASS' if ok else 'FAIL'} ({COMPARED} comparisons)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
