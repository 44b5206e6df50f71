import { describe, expect, test } from "vitest";
import { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { turboQuantCodec, KVCache } from "../src/index.ts";
import { turboValues, turboValuesKernel } from "../src/kernels/turbo-values.ts";
import { closeDiff, exactDiff } from "../../../tools/oracle/compare.ts";

const { gpu_backend, select_kernel_path } = mx.kernels;

function planes(bits: 2 | 3 | 4, dim: number): { packed: MlxArray; scale: MlxArray; centroids: MlxArray; dispose(): void } {
  using key = mx.random.key(bits * 100 + dim);
  using v0 = mx.random.normal([1, 2, 9, dim], { key });
  using v = mx.astype(v0, "bfloat16");
  const codec = turboQuantCodec({ kBits: 8, vBits: bits });
  using c = new KVCache(codec);
  using view = c.updateAndFetch(v, v);
  const packed = view.planes[3]!.retain();
  const scale = view.planes[4]!.retain();
  const book = mx.turboquant.lloyd_max_codebook(bits);
  codec.dispose();
  return { packed, scale, centroids: book.centroids, dispose: () => [packed, scale, book.centroids, book.boundaries].forEach((a) => a.dispose()) };
}

describe("TurboQuant value-decode kernel", () => {
  test("the reference equals the plain composition (unpack → centroid → × scale) for 2/3/4 bits", () => {
    for (const bits of [2, 3, 4] as const) {
      const p = planes(bits, 128);
      try {
        using out = turboValues(p.packed, p.scale, p.centroids);
        using codes = mx.turboquant.unpack_bits(p.packed, bits, 128);
        using unit = mx.turboquant.codebook_dequantize(codes, p.centroids);
        using scaled = mx.multiply(unit, p.scale);
        using want = mx.astype(scaled, "bfloat16");
        expect(out.shape).toEqual([1, 2, 9, 128]);
        expect(exactDiff(out, want), `${bits} bits`).toBeNull();
      } finally {
        p.dispose();
      }
    }
  });

  test("path selection: the reference on CPU, the backend source only on a live GPU", () => {
    expect(select_kernel_path(turboValuesKernel.spec, { gpu_backend: null, device: "cpu" })).toBe("reference");
    expect(select_kernel_path(turboValuesKernel.spec, { gpu_backend: "cuda", device: "gpu" })).toBe("cuda");
    expect(select_kernel_path(turboValuesKernel.spec, { gpu_backend: "metal", device: "gpu" })).toBe("metal");
    expect(() => select_kernel_path(turboValuesKernel.spec, { gpu_backend: null, device: "cpu" }, "cuda")).toThrow(/not live here/);
  });

  test("bad inputs are refused before any path runs", () => {
    const p = planes(4, 64);
    try {
      using wrong = MlxArray.fromNumbers([1, 2, 3], [3], "float32");
      expect(() => turboValues(p.packed, p.scale, wrong)).toThrow(/centroids must have 2\^bits entries/);
      using f = mx.astype(p.packed, "float32");
      expect(() => turboValues(f, p.scale, p.centroids)).toThrow(/packed codes must be uint8/);
    } finally {
      p.dispose();
    }
  });

  test.skipIf(gpu_backend() === null)("the GPU source equals the reference", () => {
    for (const bits of [2, 3, 4] as const) {
      const p = planes(bits, 256);
      try {
        using ref = turboValuesKernel.run([p.packed, p.scale, p.centroids], { path: "reference" })[0]!;
        using gpu = turboValuesKernel.run([p.packed, p.scale, p.centroids], { path: gpu_backend()! })[0]!;
        expect(closeDiff(gpu, ref, { atol: 0, rtol: 0 }), `${bits} bits`).toBeNull();
      } finally {
        p.dispose();
      }
    }
  });
});
