// One decode step builds mlx-lm's graph: the same primitives, each the same number of times
// (from mx.export_to_dot on both sides). A regression here (an extra cast, a gather where
// Python slices, an uncompiled activation) costs kernel launches on GPUs and bit-equality on CUDA.
// With fused projections (the default) the only difference is theirs: fewer quantized matmuls.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { setFusedProjections } from "@mlx-bun/models";
import { Engine } from "../src/index.ts";
import { countDiff, decodeStepGraph, mlxLmDecodeStepGraph, opCounts } from "../../../tools/oracle/graph.ts";
import { tinyModels } from "./helpers.ts";

const models = tinyModels({
  small: ["--variant", "small"],
  "dense-4bit": ["--variant", "dense", "--quant", "4bit"],
  moe: ["--variant", "moe", "--dtype", "float32"],
  "moe-4bit": ["--variant", "moe", "--quant", "4bit", "--dtype", "float32"],
});
const dir = mkdtempSync(join(tmpdir(), "mlxb-graph-"));
afterAll(() => {
  models.cleanup();
  rmSync(dir, { recursive: true, force: true });
});

describe("decode-step graph = mlx-lm's (op nodes per primitive)", () => {
  for (const name of ["small", "dense-4bit", "moe", "moe-4bit"]) {
    test(name, () => {
      const ours = join(dir, `${name}-mlx-bun.dot`);
      const theirs = join(dir, `${name}-mlx-lm.dot`);
      const fusedOps = join(dir, `${name}-mlx-bun-fused.dot`);
      let merged = 0;
      let groups = 0;
      {
        using engine = Engine.load(models.path(name), { kv: "bf16" });
        setFusedProjections("off");
        try {
          decodeStepGraph(engine, ours);
        } finally {
          setFusedProjections(undefined);
        }
        decodeStepGraph(engine, fusedOps);
        for (const lw of engine.loaded.model.parts.layers) {
          for (const g of [lw.fused?.qkv, lw.fused?.gateUp]) {
            if (!g) continue;
            merged += g.parts.length - 1;
            groups++;
          }
        }
      }
      mlxLmDecodeStepGraph(models.path(name), theirs);
      const a = opCounts(ours);
      const lm = opCounts(theirs);
      expect(a.size).toBeGreaterThan(5);
      expect(countDiff(a, lm)).toEqual({});
      // Fused projections (the default): one quantized matmul and a split where mlx-lm issues one
      // matmul per projection, nothing else changed (packages/models/src/model/fused-linear.ts).
      const want: Record<string, [number, number]> = groups
        ? { QuantizedMatmul: [lm.get("QuantizedMatmul")! - merged, lm.get("QuantizedMatmul")!], Split: [groups, lm.get("Split") ?? 0] }
        : {};
      expect(groups > 0).toBe(name.endsWith("4bit"));
      expect(countDiff(opCounts(fusedOps), lm)).toEqual(want);
    });
  }
});
