"""Try the CUDA sources exported by tools/kernels/export-sources.ts on a CUDA machine.

Usage: python check_cuda_kernels.py kernel-sources.json   (needs mlx + mlx-cuda-13)

Each kernel's CUDA body runs through mx.fast.cuda_kernel and is compared with its reference
composition evaluated on float32 copies of the inputs and rounded to the dtype (the sources
compute in float32 and round once), within the tolerances of packages/mlx-ops/test/kernels.test.ts.
"""
import json
import sys

import mlx.core as mx
import mlx.nn as nn

# The reference compositions, as in the kernels' TypeScript `reference` functions.
REFERENCES = {"mlxb_geglu": lambda g, u: nn.gelu_approx(g) * u}
TOL = {mx.float32: (1e-6, 1e-5), mx.bfloat16: (1e-6, 2**-7), mx.float16: (1e-6, 2**-10)}


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
        ref_fn = REFERENCES[spec["name"]]
        for dt, (atol, rtol) in TOL.items():
            for shape in [(1000,), (3, 7, 129), (2, 4096), (1,), (257,)]:
                mx.random.seed(0)
                ins = [mx.random.normal(shape).astype(dt) for _ in spec["input_names"]]
                out = k(inputs=ins, template=[("T", dt)], grid=(ins[0].size, 1, 1), threadgroup=(256, 1, 1),
                        output_shapes=[shape], output_dtypes=[dt])[0]
                ref = ref_fn(*[a.astype(mx.float32) for a in ins]).astype(dt).astype(mx.float32)
                d = mx.abs(out.astype(mx.float32) - ref)
                bad = int(mx.sum(d > atol + rtol * mx.abs(ref)).item())
                print(f"{spec['name']} {dt} {shape}: max |diff| {mx.max(d).item():.3g}, outside tolerance {bad}")
                ok = ok and bad == 0
    print("RESULT", "PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
