"""Try the CUDA sources exported by tools/kernels/export-sources.ts on a CUDA machine.

Usage: python check_cuda_kernels.py kernel-sources.json   (needs mlx + mlx-cuda-13)

Each kernel's CUDA body runs through mx.fast.cuda_kernel on the cases below and is compared with
its reference composition (as in the kernels' TypeScript `reference` functions) evaluated on
float32 copies of the inputs and rounded to the dtype (the sources compute in float32 and round
once), within the tolerances of the TypeScript kernel tests.
"""
import json
import math
import sys

import mlx.core as mx
import mlx.nn as nn

TOL = {mx.float32: (1e-6, 1e-5), mx.bfloat16: (1e-6, 2**-7), mx.float16: (1e-6, 2**-10)}


def geglu_cases():
    for dt, tol in TOL.items():
        for shape in [(1000,), (3, 7, 129), (2, 4096), (1,), (257,)]:
            mx.random.seed(0)
            g, u = (mx.random.normal(shape).astype(dt) for _ in range(2))
            ref = (nn.gelu_approx(g.astype(mx.float32)) * u.astype(mx.float32)).astype(dt)
            yield f"{dt} {shape}", dict(inputs=[g, u], template=[("T", dt)], grid=(g.size, 1, 1),
                                         threadgroup=(256, 1, 1), output_shapes=[shape], output_dtypes=[dt]), ref, tol


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
                    output_shapes=[(*lead, dim)], output_dtypes=[dt]), ref, (0.0, 0.0)


CASES = {"mlxb_geglu": geglu_cases, "mlxb_turbo_values": turbo_values_cases}


def main() -> None:
    assert mx.cuda.is_available(), "no CUDA backend in this MLX"
    mx.set_default_device(mx.gpu)
    ok = True
    for spec in json.load(open(sys.argv[1])):
        if not spec["cuda"]:
            continue
        k = mx.fast.cuda_kernel(
            name=spec["name"], input_names=spec["input_names"], output_names=spec["output_names"],
            source=spec["cuda"]["source"], header=spec["cuda"].get("header", ""),
        )
        for label, launch, ref, (atol, rtol) in CASES[spec["name"]]():
            out = k(**launch)[0]
            r = ref.astype(mx.float32)
            d = mx.abs(out.astype(mx.float32) - r)
            bad = int(mx.sum(d > atol + rtol * mx.abs(r)).item())
            print(f"{spec['name']} {label}: max |diff| {mx.max(d).item():.3g}, outside tolerance {bad}")
            ok = ok and bad == 0
    print("RESULT", "PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
