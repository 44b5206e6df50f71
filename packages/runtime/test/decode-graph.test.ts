// One decode step builds mlx-lm's graph: the same primitives, each the same number of times
// (from mx.export_to_dot on both sides). A regression here (an extra cast, a gather where
// Python slices, an uncompiled activation) costs kernel launches on GPUs and bit-equality on CUDA.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
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
      {
        using engine = Engine.load(models.path(name), { kv: "bf16" });
        decodeStepGraph(engine, ours);
      }
      mlxLmDecodeStepGraph(models.path(name), theirs);
      const a = opCounts(ours);
      expect(a.size).toBeGreaterThan(5);
      expect(countDiff(a, opCounts(theirs))).toEqual({});
    });
  }
});
