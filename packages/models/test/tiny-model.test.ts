import { readFileSync, readdirSync, rmSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { runPython } from "../../../tools/oracle/oracle.ts";
import { Gemma4Tokenizer, loadGemma4Config } from "../src/index.ts";
import { MAKER, makeSuite, makeTiny, SUITE, type TinySuite } from "./helpers.ts";

let suite: TinySuite;
let scratch: string;
type Gen = { path: string; prompt_tokens?: number; tokens?: number[]; text?: string; skipped?: string };
let gens: Gen[];

beforeAll(() => {
  suite = makeSuite();
  scratch = mkdtempSync(join(tmpdir(), "mlxb-tiny-"));
  gens = JSON.parse(runPython([MAKER, "--generate", ...SUITE.map((n) => suite.path(n)), "--tokens", "20"]));
});
afterAll(() => {
  suite?.cleanup();
  rmSync(scratch, { recursive: true, force: true });
});

describe("tiny checkpoints load in mlx-lm and generate", () => {
  test.each(SUITE.map((n, i) => [n, i] as const))("%s: mlx_lm.load + 20 greedy tokens", (name, i) => {
    const g = gens[i]!;
    if (name === "moe-bf16" && g.skipped) {
      // MLX's CPU backend has no bf16 gather_mm; moe-f32 and moe-4bit cover MoE there.
      expect(g.skipped).toMatch(/GatherMM/);
      return;
    }
    expect(g.skipped).toBeUndefined();
    const vocab = loadGemma4Config(suite.path(name)).text.vocabSize;
    expect(g.tokens!.length).toBe(20);
    for (const t of g.tokens!) expect(t >= 0 && t < vocab).toBe(true);
    // Our tokenizer decodes mlx-lm's tokens to the same text as transformers.
    expect(Gemma4Tokenizer.load(suite.path(name)).decode(g.tokens!)).toBe(g.text);
    // The random model is not stuck on one token (a useful oracle for the port).
    expect(new Set(g.tokens!).size).toBeGreaterThan(1);
  });
});

describe("determinism", () => {
  const files = (d: string) =>
    Object.fromEntries(
      readdirSync(d)
        .sort()
        .map((f) => [f, readFileSync(join(d, f)).toString("base64")]),
    );

  test("same seed, same bytes; another seed, other weights", () => {
    const a = makeTiny(join(scratch, "a"), ["--variant", "small"]);
    const b = makeTiny(join(scratch, "b"), ["--variant", "small"]);
    const c = makeTiny(join(scratch, "c"), ["--variant", "small", "--seed", "1"]);
    expect(files(a)).toEqual(files(b));
    expect(files(a)).toEqual(files(suite.path("small-bf16")));
    expect(files(c)["model.safetensors"]).not.toBe(files(a)["model.safetensors"]);
    expect(files(c)["tokenizer.json"]).toBe(files(a)["tokenizer.json"]);
  });

  test("quantized output is reproducible", () => {
    const q = makeTiny(join(scratch, "q"), ["--variant", "moe", "--quant", "4bit"]);
    expect(files(q)).toEqual(files(suite.path("moe-4bit")));
  });

  test("text form, sharding and mlx naming options", () => {
    const d = makeTiny(join(scratch, "t"), ["--variant", "small", "--form", "text", "--shards", "2", "--naming", "mlx", "--template-in-config"]);
    expect(readdirSync(d).sort()).toEqual([
      "config.json",
      "generation_config.json",
      "model-00001-of-00002.safetensors",
      "model-00002-of-00002.safetensors",
      "model.safetensors.index.json",
      "tokenizer.json",
      "tokenizer_config.json",
    ]);
    const cfg = loadGemma4Config(d);
    expect(cfg.form).toBe("text");
    expect(cfg.text.hiddenSizePerLayerInput).toBe(16);
  });
});
