// TurboQuant primitives: FWHT rotation (vs Python MLX's hadamard_transform, and orthonormality),
// Lloyd-Max codebooks (vs closed forms, an independent quadrature and Max's 1960 table),
// codebook lookup and bit-packing (vs numpy's packbits on the same codes).
import { describe, expect, test } from "vitest";
import { MlxArray } from "@mlx-bun/mlx-ffi";
import { oracle } from "../../../tools/oracle/oracle.ts";
import { maxAbsDiff } from "../../../tools/oracle/compare.ts";
import { turboquant as tq } from "../src/turboquant.ts";
import { expectExact, expectNoLeaks, randint, randn } from "./seeded-inputs.ts";

const ROOT = new URL("../../../", import.meta.url).pathname;

describe("FWHT with random signs", () => {
  test("forward and inverse equal Python's hadamard_transform composition, bit-exact", () => {
    const inputs: Record<string, MlxArray> = {};
    const cases: Record<string, string> = {};
    for (const n of tq.FWHT_SIZES) {
      inputs[`s${n}`] = tq.random_signs(n, 1234 + n);
      for (const dt of ["float32", "bfloat16", "float16"] as const) {
        inputs[`x${n}_${dt}`] = randn([3, 2, n], n, dt);
        cases[`f${n}_${dt}`] = `mx.hadamard_transform(x${n}_${dt} * s${n}.astype(x${n}_${dt}.dtype))`;
        cases[`i${n}_${dt}`] = `mx.hadamard_transform(x${n}_${dt}) * s${n}.astype(x${n}_${dt}.dtype)`;
        cases[`p${n}_${dt}`] = `mx.hadamard_transform(x${n}_${dt})`;
      }
    }
    using ref = oracle(inputs, cases);
    try {
      expectNoLeaks(() => {
        for (const n of tq.FWHT_SIZES) {
          const s = inputs[`s${n}`]!;
          for (const dt of ["float32", "bfloat16", "float16"]) {
            const x = inputs[`x${n}_${dt}`]!;
            using f = tq.fwht(x, s);
            expectExact(f, ref.get(`f${n}_${dt}`), `fwht n=${n} ${dt}`);
            using i = tq.fwht_inverse(x, s);
            expectExact(i, ref.get(`i${n}_${dt}`), `fwht_inverse n=${n} ${dt}`);
            using p = tq.fwht(x);
            expectExact(p, ref.get(`p${n}_${dt}`), `fwht without signs n=${n} ${dt}`);
          }
        }
      });
    } finally {
      for (const a of Object.values(inputs)) a.dispose();
    }
  });

  // Tolerances: float32 2e-6 on the round trip and the norm ratio; bfloat16 (8 significant
  // bits, rounded after each direction) 2^-6 of the largest |x| and 2^-7 on the norm ratio.
  test("orthonormal: inverse(forward(x)) = x and norms are kept", () => {
    for (const n of tq.FWHT_SIZES) {
      using s = tq.random_signs(n, 7);
      for (const [dt, tol] of [
        ["float32", 2e-6],
        ["bfloat16", 2 ** -7],
      ] as const) {
        using x = randn([8, n], 100 + n, dt);
        using y = tq.fwht(x, s);
        using back = tq.fwht_inverse(y, s);
        const xs = x.toFloat64Array();
        const ys = y.toFloat64Array();
        const maxAbs = Math.max(...Array.from(xs, Math.abs));
        expect(maxAbsDiff(back, x), `round trip n=${n} ${dt}`).toBeLessThan(dt === "float32" ? tol : 2 ** -6 * maxAbs);
        for (let r = 0; r < 8; r++) {
          let nx = 0;
          let ny = 0;
          for (let i = 0; i < n; i++) {
            nx += xs[r * n + i]! ** 2;
            ny += ys[r * n + i]! ** 2;
          }
          expect(Math.abs(Math.sqrt(ny) / Math.sqrt(nx) - 1), `norm n=${n} ${dt} row ${r}`).toBeLessThan(tol);
        }
      }
      // H/√n of a basis vector is the constant 1/√n: the scaling is orthonormal.
      using e0 = MlxArray.fromNumbers(
        Array.from({ length: n }, (_, i) => (i === 0 ? 1 : 0)),
        [n],
      );
      using h = tq.fwht(e0);
      for (const v of h.toFloat64Array()) expect(Math.abs(v - 1 / Math.sqrt(n))).toBeLessThan(1e-7);
    }
  });

  test("random signs are ±1, seeded, platform-independent (pinned values)", () => {
    const a = tq.sign_values(512, 42);
    expect(Array.from(tq.sign_values(512, 42))).toEqual(Array.from(a));
    expect(a.every((v) => v === 1 || v === -1)).toBe(true);
    const plus = a.filter((v) => v === 1).length;
    expect(plus).toBeGreaterThan(200);
    expect(plus).toBeLessThan(312);
    expect(Array.from(tq.sign_values(512, 43))).not.toEqual(Array.from(a));
    // A prefix does not depend on n (counter-based), so one seed serves every head dim.
    expect(Array.from(tq.sign_values(64, 42))).toEqual(Array.from(a.slice(0, 64)));
    // Pinned: these persist with rotated KV caches, so they must never change.
    expect(Array.from(tq.sign_values(16, 0)).join(",")).toBe(PINNED_SEED0);
    expect(() => tq.sign_values(8, 1.5)).toThrow(/seed must be an integer/);
  });

  test("errors name the op and shapes", () => {
    using x = randn([2, 96], 1);
    expect(() => tq.fwht(x)).toThrow(/^turboquant\.fwht\(array\(shape=\[2, 96\], dtype=float32\), signs=None\): .*96 is not a power of two/);
    using y = randn([2, 64], 2);
    using s = tq.random_signs(128, 1);
    expect(() => tq.fwht_inverse(y, s)).toThrow(/turboquant\.fwht_inverse\(array\(shape=\[2, 64\].*signs must have shape \[64\]/);
    using i = randint([2, 64], 4, 3);
    expect(() => tq.fwht(i)).toThrow(/needs a floating-point input/);
  });
});
const PINNED_SEED0 = "1,-1,1,-1,-1,-1,-1,-1,1,-1,1,-1,1,1,-1,1";

// Independent check of the codebooks: Simpson's rule on the Gaussian density (no erf used).
function integrate(f: (x: number) => number, a: number, b: number, steps = 20000): number {
  const lo = Math.max(a, -12);
  const hi = Math.min(b, 12);
  if (hi <= lo) return 0;
  const h = (hi - lo) / steps;
  let s = f(lo) + f(hi);
  for (let i = 1; i < steps; i++) s += (i % 2 ? 4 : 2) * f(lo + i * h);
  return (s * h) / 3;
}
const phi = (x: number): number => Math.exp(-0.5 * x * x) / Math.sqrt(2 * Math.PI);

describe("Lloyd-Max codebooks of N(0, 1)", () => {
  test("1 bit is ±√(2/π) with MSE 1 - 2/π (closed form)", () => {
    const b1 = tq.LLOYD_MAX_GAUSSIAN[1];
    expect(b1.centroids[1]).toBeCloseTo(Math.sqrt(2 / Math.PI), 15);
    expect(b1.centroids[0]).toBe(-b1.centroids[1]!);
    expect(b1.boundaries).toEqual([0]);
    expect(b1.mse).toBeCloseTo(1 - 2 / Math.PI, 14);
  });

  test("every codebook meets the Lloyd-Max conditions by independent quadrature (1e-10)", () => {
    for (const bits of [1, 2, 3, 4] as const) {
      const { centroids: c, boundaries: b, mse } = tq.LLOYD_MAX_GAUSSIAN[bits];
      expect(c.length).toBe(2 ** bits);
      expect(b.length).toBe(2 ** bits - 1);
      for (let i = 1; i < c.length; i++) expect(c[i]!).toBeGreaterThan(c[i - 1]!);
      for (let i = 0; i < b.length; i++) expect(b[i]).toBeCloseTo((c[i]! + c[i + 1]!) / 2, 15);
      const edges = [-Infinity, ...b, Infinity];
      let err = 0;
      for (let i = 0; i < c.length; i++) {
        const p = integrate(phi, edges[i]!, edges[i + 1]!);
        const m = integrate((x) => x * phi(x), edges[i]!, edges[i + 1]!);
        expect(Math.abs(m / p - c[i]!), `centroid ${i} of ${bits} bits`).toBeLessThan(1e-10);
        err += integrate((x) => (x - c[i]!) ** 2 * phi(x), edges[i]!, edges[i + 1]!);
      }
      expect(Math.abs(err - mse), `mse of ${bits} bits`).toBeLessThan(1e-10);
    }
  });

  // Max's table has 4 decimals but its last digit is off by up to 1 in places (3 bits: 1.3440
  // for 1.34391, 2.1520 for 2.15195), so the check is to 1e-4.
  test("agree with Max (1960), Table I, to 1e-4", () => {
    const max1960: Record<number, number[]> = {
      2: [0.4528, 1.5104],
      3: [0.2451, 0.756, 1.344, 2.152],
      4: [0.1284, 0.3881, 0.6568, 0.9424, 1.2562, 1.618, 2.069, 2.7326],
    };
    for (const [bits, pos] of Object.entries(max1960)) {
      const c = tq.LLOYD_MAX_GAUSSIAN[Number(bits) as 2 | 3 | 4].centroids;
      const upper = c.slice(c.length / 2);
      upper.forEach((v, i) => expect(Math.abs(v - pos[i]!), `${bits} bits level ${i}`).toBeLessThan(1e-4));
    }
  });

  test("the generated file is what tools/lloyd-max.ts computes now", () => {
    const p = Bun.spawnSync([process.execPath, "tools/lloyd-max.ts", "--check"], { cwd: ROOT, stdout: "pipe", stderr: "pipe" });
    expect(p.stderr.toString()).toBe("");
    expect(p.exitCode).toBe(0);
  });

  test("codebook quantize / dequantize equal the numpy-free MLX composition, and pick the nearest level", () => {
    using x = randn([4, 128], 9, "float32", 1 / Math.sqrt(128));
    const inputs: Record<string, MlxArray> = { x };
    const cases: Record<string, string> = {};
    const books = [1, 2, 3, 4].map((bits) => tq.lloyd_max_codebook(bits, { scale: 1 / Math.sqrt(128) }));
    try {
      for (const cb of books) {
        inputs[`b${cb.bits}`] = cb.boundaries;
        inputs[`c${cb.bits}`] = cb.centroids;
        cases[`q${cb.bits}`] = `(x[..., None] > b${cb.bits}).sum(-1).astype(mx.uint8)`;
        cases[`d${cb.bits}`] = `c${cb.bits}[(x[..., None] > b${cb.bits}).sum(-1)]`;
      }
      using ref = oracle(inputs, cases);
      for (const cb of books) {
        using q = tq.codebook_quantize(x, cb.boundaries);
        expectExact(q, ref.get(`q${cb.bits}`), `codebook_quantize ${cb.bits} bits`);
        using d = tq.codebook_dequantize(q, cb.centroids);
        expectExact(d, ref.get(`d${cb.bits}`), `codebook_dequantize ${cb.bits} bits`);
        const xs = x.toFloat64Array();
        const cs = cb.centroids.toFloat64Array();
        const ds = d.toFloat64Array();
        xs.forEach((v, i) => {
          const best = Math.min(...Array.from(cs, (c) => Math.abs(c - v)));
          expect(Math.abs(ds[i]! - v)).toBeCloseTo(best, 6);
        });
      }
    } finally {
      for (const cb of books) cb.dispose();
    }
    expect(() => tq.lloyd_max_codebook(5)).toThrow(/bits must be 1, 2, 3 or 4/);
  });
});

// The packed layout, written out bit by bit: a little-endian bit stream per row.
function packRef(codes: number[], bits: number): number[] {
  const out = new Array(Math.ceil((codes.length * bits) / 8)).fill(0);
  codes.forEach((v, i) => {
    for (let k = 0; k < bits; k++) if ((v >> k) & 1) out[(i * bits + k) >> 3] |= 1 << ((i * bits + k) & 7);
  });
  return out;
}

describe("pack / unpack of 1-8-bit codes into uint8", () => {
  test("round-trips every bit width and matches numpy's little-endian packbits", () => {
    const inputs: Record<string, MlxArray> = {};
    const cases: Record<string, string> = {};
    const ns = [64, 128, 13, 7];
    for (let bits = 1; bits <= 8; bits++) {
      for (const n of ns) {
        inputs[`c${bits}_${n}`] = randint([3, 2, n], 2 ** bits, bits * 1000 + n, "uint8");
        cases[`p${bits}_${n}`] =
          `mx.array(np.packbits(((np.array(c${bits}_${n})[..., None] >> np.arange(${bits}, dtype=np.uint8)) & 1).reshape(3, 2, -1), axis=-1, bitorder="little"))`;
      }
    }
    using ref = oracle(inputs, cases);
    try {
      expectNoLeaks(() => {
        for (let bits = 1; bits <= 8; bits++) {
          for (const n of ns) {
            const codes = inputs[`c${bits}_${n}`]!;
            using p = tq.pack_bits(codes, bits);
            expect(p.shape).toEqual([3, 2, tq.packed_length(n, bits)]);
            expectExact(p, ref.get(`p${bits}_${n}`), `pack ${bits} bits n=${n}`);
            // and the layout spelled out in JS, for the first row
            const row = Array.from(codes.toFloat64Array().slice(0, n));
            expect(Array.from(p.toFloat64Array().slice(0, tq.packed_length(n, bits)))).toEqual(packRef(row, bits));
            using u = tq.unpack_bits(p, bits, n);
            expectExact(u, codes, `unpack(pack) ${bits} bits n=${n}`);
          }
        }
      });
    } finally {
      for (const a of Object.values(inputs)) a.dispose();
    }
  });

  test("codes are masked to their bits; int32 codes pack too; errors name shapes", () => {
    using big = MlxArray.fromNumbers([7, 255, 4, 9, 0, 1, 2, 3], [8], "int32");
    using p = tq.pack_bits(big, 2);
    using u = tq.unpack_bits(p, 2, 8);
    expect(Array.from(u.toFloat64Array())).toEqual([3, 3, 0, 1, 0, 1, 2, 3]);
    expect(u.dtype).toBe("uint8");
    using bytes = MlxArray.fromNumbers([1, 2, 3], [3], "uint8");
    expect(() => tq.unpack_bits(bytes, 4, 8)).toThrow(
      /^turboquant\.unpack\(array\(shape=\[3\], dtype=uint8\), bits=4, n=8\): .*last dimension 3 is not ceil\(8\*4\/8\) = 4/,
    );
    expect(() => tq.pack_bits(big, 9)).toThrow(/bits must be an integer in 1\.\.8/);
    using f = randn([8], 1);
    expect(() => tq.pack_bits(f, 4)).toThrow(/turboquant\.pack\(array\(shape=\[8\], dtype=float32\), bits=4\): .*needs integer/);
  });
});
