// --exact: the CLI's switch to MLX's own kernels (the mlx-lm path) where mlx-bun's exact kernels are
// the default (CUDA sm90); it must reach mlx-ops' settings before the model loads.
import { Command } from "commander";
import { describe, expect, test } from "vitest";
import { exactKernels } from "../src/load.ts";
import { addModelOptions, type ModelOptions } from "../src/options.ts";

const parse = (argv: string[]): ModelOptions => {
  const cmd = addModelOptions(new Command("generate")).exitOverride();
  cmd.parse(argv, { from: "user" });
  return cmd.opts<ModelOptions>();
};

describe("--exact", () => {
  test("parses, and turns both kernel settings off (only when given)", () => {
    expect(parse(["--exact"]).exact).toBe(true);
    expect(parse([]).exact).toBeUndefined();
    const env: NodeJS.ProcessEnv = { MLX_BUN_FAST_QMV: "exact" };
    exactKernels(parse([]), env);
    expect(env).toEqual({ MLX_BUN_FAST_QMV: "exact" });
    exactKernels(parse(["--exact"]), env);
    expect(env).toEqual({ MLX_BUN_FAST_QMV: "off", MLX_BUN_EXACT_NORMS: "off", MLX_BUN_SDPA_DECODE: "off" });
  });
});
