// Fused q/k/v and gate/up projections (src/model/fused-linear.ts): which layers fuse, that the
// parts become views of the fused tensors (no memory added), and that decode through them gives
// mlx-lm's logits is forward.test.ts (its 4-bit cases run with fusion on, the default).
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { evaluate, exportToDot, type MlxArray, memory } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { Gemma4Model, loadGemma4Config, loadWeights } from "../src/index.ts";
import { FUSED_MAX_DIM, fuseLinears, linearParts, setFusedProjections } from "../src/model/fused-linear.ts";
import { linear, type ModuleWeights } from "../src/model/nn.ts";
import { exactDiff } from "../../../tools/oracle/compare.ts";
import { opCounts } from "../../../tools/oracle/dot-ops.ts";
import { makeSuite, type TinySuite } from "./helpers.ts";

let suite: TinySuite;
const dotDir = mkdtempSync(join(tmpdir(), "mlxb-fused-"));
beforeAll(() => {
  suite = makeSuite();
});
afterAll(() => {
  suite?.cleanup();
  rmSync(dotDir, { recursive: true, force: true });
});

function withEnv<T>(value: string | undefined, fn: () => T): T {
  const old = process.env.MLX_BUN_FUSED_PROJECTIONS;
  if (value === undefined) delete process.env.MLX_BUN_FUSED_PROJECTIONS;
  else process.env.MLX_BUN_FUSED_PROJECTIONS = value;
  try {
    return fn();
  } finally {
    if (old === undefined) delete process.env.MLX_BUN_FUSED_PROJECTIONS;
    else process.env.MLX_BUN_FUSED_PROJECTIONS = old;
  }
}

/** A tiny checkpoint's weights and model, disposed together. */
function open(name: Parameters<TinySuite["path"]>[0]) {
  const ckpt = suite.path(name);
  const config = loadGemma4Config(ckpt);
  const weights = loadWeights(ckpt, config);
  const model = new Gemma4Model(config, weights.tensors);
  return {
    weights,
    model,
    [Symbol.dispose]() {
      model.dispose();
      weights.dispose();
    },
  };
}

/** Evaluate every tensor and fused tensor of a model: the active bytes after, over `base`, and the tensors' own bytes. */
function loadedBytes(name: Parameters<TinySuite["path"]>[0]): { held: number; tensors: number } {
  memory.clearCache();
  const base = memory.active();
  const m = open(name);
  const { weights, model } = m;
  const fused = model.parts.layers
    .flatMap((lw) => [lw.fused?.qkv, lw.fused?.gateUp])
    .flatMap((g) => (g ? [g.fused.weight, g.fused.scales!, g.fused.biases!] : []));
  expect(fused.length).toBeGreaterThan(0);
  // One array at a time. (Evaluated all at once, small-4bit holds 1,152 bytes more, one k
  // projection's size, of 300,924: not explained yet; docs/fused-projections.md.)
  for (const a of [...fused, ...weights.tensors.values()]) evaluate(a);
  const held = memory.active() - base;
  let tensors = 0;
  for (const a of weights.tensors.values()) tensors += a.nbytes;
  m[Symbol.dispose]();
  memory.clearCache();
  expect(memory.active()).toBe(base);
  return { held, tensors };
}

describe("fused projections", () => {
  test("4-bit layers fuse q/k(/v) and gate/up; bf16 and mixed-precision layers do not", () => {
    for (const [name, expectFused] of [
      ["small-4bit", true],
      ["moe-4bit", true],
      ["dense-bf16", false],
    ] as const) {
      using m = open(name);
      const { model } = m;
      for (const lw of model.parts.layers) {
        if (!expectFused) {
          expect(lw.fused, `${name} layer ${lw.spec.index}`).toBeUndefined();
          continue;
        }
        expect(lw.fused?.gateUp, `${name} layer ${lw.spec.index} gate/up`).toBeDefined();
        if (lw.k) expect(lw.fused?.qkv, `${name} layer ${lw.spec.index} q/k/v`).toBeDefined();
        const g = lw.fused!.gateUp!;
        expect(g.fused.weight.shape[0]).toBe(lw.gate.weight.shape[0]! + lw.up.weight.shape[0]!);
        // The parts' rows are the fused rows: the same bytes, as views.
        using top = mx.slice(g.fused.weight, [0, 0], [lw.gate.weight.shape[0]!, g.fused.weight.shape[1]!]);
        expect(exactDiff(top, lw.gate.weight)).toBeNull();
      }
    }
  });

  test("mixed precision (8-bit next to 4-bit) never fuses modules of different widths", () => {
    using m = open("dense-mixed");
    const { model } = m;
    for (const lw of model.parts.layers) {
      for (const g of [lw.fused?.qkv, lw.fused?.gateUp]) {
        if (!g) continue;
        const bits = new Set(g.parts.map((p) => p.quant?.bits));
        expect(bits.size, `layer ${lw.spec.index}`).toBe(1);
      }
    }
  });

  test("the fused tensors add no memory: the parts are views of them", () => {
    const { held, tensors } = loadedBytes("small-4bit");
    // The tensors' bytes (parts counted as their own rows) and at most a few bytes of other arrays.
    expect(held).toBeGreaterThanOrEqual(tensors);
    expect(held - tensors).toBeLessThan(64);
  });

  test("a bad MLX_BUN_FUSED_PROJECTIONS is an error naming the variable", () => {
    const ckpt = suite.path("small-4bit");
    const config = loadGemma4Config(ckpt);
    using weights = loadWeights(ckpt, config);
    expect(() => withEnv("maybe", () => new Gemma4Model(config, weights.tensors))).toThrow(/MLX_BUN_FUSED_PROJECTIONS=maybe: expected on or off/);
  });

  test("a stack taller than FUSED_MAX_DIM fuses only with parts within it, and gives each part's own outputs", () => {
    using key = mx.random.key(5);
    const owned: MlxArray[] = [];
    const made: MlxArray[] = [];
    const part = (rows: number): ModuleWeights => {
      const w = mx.random.normal([rows, 128], { dtype: "bfloat16", key });
      const [weight, scales, biases] = mx.quantize(w, { group_size: 64, bits: 4 });
      w.dispose();
      made.push(weight, scales, biases!);
      return { weight, scales, biases, quant: { groupSize: 64, bits: 4, mode: "affine" } };
    };
    try {
      // Past the bound only as a stack: fused, marked tall with its widest part.
      const parts = [part(8200), part(8192)];
      const g = fuseLinears(parts, owned, (_, view) => made.push(view))!;
      expect(g.tall).toBe(8200);
      expect(8200 + 8192).toBeGreaterThan(FUSED_MAX_DIM);
      // A part past the bound: MLX's op itself would leave its qmv for that part, so no stack.
      expect(fuseLinears([part(FUSED_MAX_DIM + 8), part(8)], owned, () => {})).toBeNull();
      using x = mx.random.normal([1, 1, 128], { dtype: "bfloat16", key });
      const got = linearParts(g, parts, x);
      const want = parts.map((p) => linear(p, x));
      try {
        for (let i = 0; i < parts.length; i++) expect(exactDiff(got[i]!, want[i]!), `part ${i}`).toBeNull();
      } finally {
        for (const a of [...got, ...want]) a.dispose();
      }
    } finally {
      for (const a of [...owned, ...made]) a.dispose();
    }
  });

  test("a single row takes the fused matmul and gives each part's own outputs; several rows and an adapter take the parts", () => {
    using m = open("small-4bit");
    const lw = m.model.parts.layers.find((l) => l.fused?.qkv && l.v)!;
    const parts = [lw.q, lw.k!, lw.v!];
    const hidden = (lw.q.weight.shape[1]! * 32) / lw.q.quant!.bits;
    using key = mx.random.key(3);
    for (const rows of [1, 3]) {
      using x = mx.random.normal([1, rows, hidden], { dtype: "bfloat16", key });
      const got = linearParts(lw.fused!.qkv, parts, x);
      const want = parts.map((p) => linear(p, x));
      try {
        for (let i = 0; i < parts.length; i++) {
          expect(got[i]!.shape).toEqual(want[i]!.shape);
          expect(exactDiff(got[i]!, want[i]!), `rows ${rows}, part ${i}`).toBeNull();
        }
      } finally {
        for (const a of [...got, ...want]) a.dispose();
      }
    }
    // The graphs: one quantized matmul and a split for one row, one matmul per part otherwise.
    const matmuls = (rows: number, setting: "on" | "off"): number => {
      setFusedProjections(setting);
      try {
        using x = mx.random.normal([1, rows, hidden], { dtype: "bfloat16", key });
        const outs = linearParts(lw.fused!.qkv, parts, x);
        try {
          const file = join(dotDir, `g-${rows}-${setting}.dot`);
          exportToDot(file, ...outs);
          const ops = opCounts(file);
          return (ops.get("QuantizedMatmul") ?? 0) * 10 + (ops.get("Split") ?? 0);
        } finally {
          for (const o of outs) o.dispose();
        }
      } finally {
        setFusedProjections(undefined);
      }
    };
    expect(matmuls(1, "on")).toBe(11);
    expect(matmuls(1, "off")).toBe(30);
    expect(matmuls(3, "on")).toBe(30);
    // An adapter on one part: each part alone (the fused weights do not carry it), its output moved.
    using a = mx.full([hidden, 2], 0.01, "bfloat16");
    using b = mx.ones([2, lw.k!.weight.shape[0]!], "bfloat16");
    lw.k!.lora = { a, b, scale: 1 };
    try {
      using x = mx.ones([1, 1, hidden], "bfloat16");
      const got = linearParts(lw.fused!.qkv, parts, x);
      using want = linear(lw.k!, x);
      using base = linear({ ...lw.k!, lora: undefined }, x);
      try {
        expect(exactDiff(got[1]!, want)).toBeNull();
        expect(exactDiff(base, want)).not.toBeNull();
      } finally {
        for (const g of got) g.dispose();
      }
    } finally {
      delete lw.k!.lora;
    }
  });
});
