// Attention at scale 1 as MLX composes it, less the multiply by 1 (sdpa-unit-scale.ts): MLX's own
// fast.scaled_dot_product_attention is the reference, bit for bit, on this CPU (where MLX always
// composes); its graph has one Multiply fewer; calls it does not take come back null.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { type Dtype, evaluate, exportToDot, type MlxArray } from "@mlx-bun/mlx-ffi";
import { fast } from "../src/fast.ts";
import { sdpa_unit_scale, set_pv_fold } from "../src/kernels/sdpa-unit-scale.ts";
import { opCounts } from "../../../tools/oracle/dot-ops.ts";
import { expectExact, expectNoLeaks, randn } from "./seeded-inputs.ts";

const dir = mkdtempSync(join(tmpdir(), "mlxb-sdpa1-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

// [B, Hq, Hkv, L, T, D, Dv, dtype]: Gemma 4's heads (256, and 512 with k = v), GQA and not, a
// decode row and a few rows, half and single precision.
const CASES: [number, number, number, number, number, number, number, Dtype][] = [
  [1, 8, 1, 1, 37, 256, 256, "bfloat16"],
  [1, 16, 8, 1, 70, 256, 256, "bfloat16"],
  [2, 4, 4, 1, 19, 512, 512, "bfloat16"],
  [1, 2, 1, 3, 11, 64, 64, "float16"],
  [1, 6, 2, 1, 23, 32, 48, "float32"],
];

describe("sdpa_unit_scale", () => {
  for (const [B, hq, hkv, L, T, D, Dv, dtype] of CASES) {
    test(`B${B} Hq${hq} Hkv${hkv} L${L} T${T} D${D}/${Dv} ${dtype}: MLX's op bit for bit`, () => {
      expectNoLeaks(() => {
        using q = randn([B, hq, L, D], 1, dtype);
        using k = randn([B, hkv, T, D], 2, dtype);
        using v = randn([B, hkv, T, Dv], 3, dtype);
        using ref = fast.scaled_dot_product_attention(q, k, v, { scale: 1, mask: null });
        using ours = sdpa_unit_scale(q, k, v, 1);
        expect(ours).not.toBeNull();
        expect(ours!.shape).toEqual(ref.shape);
        evaluate(ours!, ref);
        expectExact(ours!, ref, "sdpa_unit_scale");
      });
    });
  }

  test("its graph is MLX's less one Multiply", () => {
    using q = randn([1, 16, 1, 256], 4, "bfloat16");
    using k = randn([1, 8, 40, 256], 5, "bfloat16");
    using v = randn([1, 8, 40, 256], 6, "bfloat16");
    using ref = fast.scaled_dot_product_attention(q, k, v, { scale: 1, mask: null });
    using ours = sdpa_unit_scale(q, k, v, 1)!;
    const count = (a: MlxArray, name: string) => {
      const f = join(dir, `${name}.dot`);
      exportToDot(f, a);
      return opCounts(f);
    };
    const theirs = count(ref, "mlx");
    const mine = count(ours, "ours");
    expect(theirs.get("Multiply")).toBe(1);
    expect(mine.get("Multiply") ?? 0).toBe(0);
    for (const p of ["Matmul", "Softmax", "Unflatten", "Flatten"]) expect(mine.get(p), p).toBe(theirs.get(p));
  });

  test("the folded p·v is CUDA's only: switched on, this CPU still issues MLX's broadcast p·v, bit for bit", () => {
    set_pv_fold(true);
    try {
      using q = randn([1, 16, 1, 256], 12, "bfloat16");
      using k = randn([1, 8, 33, 256], 13, "bfloat16");
      using v = randn([1, 8, 33, 256], 14, "bfloat16");
      using ref = fast.scaled_dot_product_attention(q, k, v, { scale: 1, mask: null });
      using ours = sdpa_unit_scale(q, k, v, 1)!;
      const f = join(dir, "fold.dot");
      exportToDot(f, ours);
      const ops = opCounts(f);
      expect(ops.get("Reshape") ?? 0).toBe(0);
      expect(ops.get("Flatten")).toBe(1);
      evaluate(ours, ref);
      expectExact(ours, ref, "sdpa_unit_scale, fold switched on");
    } finally {
      set_pv_fold(undefined);
    }
  });

  test("declines (null) a scale other than 1, mixed dtypes and heads that do not group", () => {
    using q = randn([1, 4, 1, 64], 7, "bfloat16");
    using k = randn([1, 2, 9, 64], 8, "bfloat16");
    using v = randn([1, 2, 9, 64], 9, "bfloat16");
    using kf = randn([1, 2, 9, 64], 10, "float32");
    using k3 = randn([1, 3, 9, 64], 11, "bfloat16");
    expect(sdpa_unit_scale(q, k, v, 0.125)).toBeNull();
    expect(sdpa_unit_scale(q, kf, v, 1)).toBeNull();
    expect(sdpa_unit_scale(q, k3, k3, 1)).toBeNull();
  });
});
