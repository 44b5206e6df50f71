// Every published Gemma 4 size (E2B, E4B, the 12B gemma4_unified, 26B-A4B, 31B) in every layout
// people download (Hugging Face, mlx-vlm converted bf16 / 4-bit / mixed 4-6, mlx-lm 4-bit):
// tiny random-weight checkpoints made from the published config.json values by mlx-vlm's own
// modules (tools/make-tiny-model/make_gemma4_published.py). Our loader + forward pass against
// mlx-vlm's language model on the same checkpoint (and mlx-lm's model where mlx-lm has it):
// greedy tokens and the logits of the prompt's last position and of every decode step.
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { loadSafetensors, MlxArray, memory } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { ConfigError, expectedTensors, loadModel, parseGemma4Config, parseKvMode, WeightsError } from "../src/index.ts";
import { runPython } from "../../../tools/oracle/oracle.ts";
import { maxAbsDiff } from "../../../tools/oracle/compare.ts";
import { ROOT } from "./helpers.ts";

const MAKER = join(ROOT, "tools", "make-tiny-model", "make_gemma4_published.py");
const ORACLE = join(ROOT, "tools", "oracle", "gemma4_published_oracle.py");
const DATA = join(ROOT, "packages", "models", "test", "data", "gemma4-published-configs.json");

const SIZES = ["e2b", "e4b", "12b", "26b-a4b", "31b"] as const;
const LAYOUTS = ["hf", "vlm", "vlm-4bit", "vlm-mixed", "lm-4bit"] as const;
type Size = (typeof SIZES)[number];
type Layout = (typeof LAYOUTS)[number];
/** mlx-lm 0.32.2 has gemma4 (and gemma4_text), not gemma4_unified. */
const HAS_MLX_LM = (s: Size): boolean => s !== "12b";
const layoutsOf = (s: Size): Layout[] => LAYOUTS.filter((l) => l !== "lm-4bit" || HAS_MLX_LM(s));

// Token ids from 30 up: clear of the tiny tokenizer's special and image/audio placeholder tokens.
const PROMPT = Array.from({ length: 64 }, (_, i) => 30 + ((i * 37) % 400));
const STEPS = 20;

interface PublishedEntry {
  hf: string;
  confidence: string;
  config: Record<string, unknown>;
}
const published = (JSON.parse(readFileSync(DATA, "utf8")) as { sizes: Record<Size, PublishedEntry> }).sizes;

const dir = mkdtempSync(join(tmpdir(), "mlxb-published-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

interface RefResult {
  dir?: string;
  ref: string;
  ok: boolean;
  error?: string;
  params?: Record<string, number[]>;
}
const refOut = (s: Size, l: Layout, ref: "vlm" | "lm") => join(dir, `ref-${s}-${l}-${ref}.safetensors`);
let refErrors = new Map<string, string>();
let manifests: Record<string, number[]>[] = [];

beforeAll(() => {
  runPython([MAKER, "--out", join(dir, "ckpt")]);
  const jobs: Record<string, unknown>[] = [];
  for (const s of SIZES) {
    for (const l of layoutsOf(s)) {
      jobs.push({ dir: join(dir, "ckpt", s, l), ref: "vlm", out: refOut(s, l, "vlm") });
      if (HAS_MLX_LM(s)) jobs.push({ dir: join(dir, "ckpt", s, l), ref: "lm", out: refOut(s, l, "lm") });
    }
  }
  for (const s of SIZES) jobs.push({ ref: "manifest", config: published[s].config });
  jobs.push({ ref: "manifest", config: { model_type: "gemma4_unified" } }); // every default
  const spec = join(dir, "jobs.json");
  writeFileSync(spec, JSON.stringify({ ids: PROMPT, steps: STEPS, jobs }));
  const results = JSON.parse(runPython([ORACLE, spec])) as RefResult[];
  refErrors = new Map(results.filter((r) => !r.ok).map((r) => [`${r.dir}:${r.ref}`, r.error ?? "?"]));
  manifests = results.filter((r) => r.ref === "manifest").map((r) => r.params ?? {});
});

/** Load with loadModel (the user's path), prefill the prompt in one call, decode STEPS greedy tokens. */
function ours(ckpt: string): { rows: MlxArray[]; tokens: number[]; warnings: string[] } {
  using m = loadModel(ckpt);
  const caches = m.model.makeCaches(parseKvMode("bf16"));
  const rows: MlxArray[] = [];
  const tokens: number[] = [];
  try {
    using ids = MlxArray.fromNumbers(PROMPT, [1, PROMPT.length], "int32");
    let logits = m.model.forward(ids, caches).eval();
    for (let i = 0; i <= STEPS; i++) {
      const last = mx.index(logits, 0, -1);
      rows.push(last.eval());
      logits.dispose();
      if (i === STEPS) break;
      using am = mx.argmax(last, -1);
      const tok = am.item();
      tokens.push(tok);
      using next = MlxArray.fromNumbers([tok], [1, 1], "int32");
      logits = m.model.forward(next, caches).eval();
    }
    return { rows, tokens, warnings: m.warnings ?? [] };
  } finally {
    for (const c of caches) c.dispose();
  }
}

function compare(mine: { rows: MlxArray[]; tokens: number[] }, s: Size, l: Layout, ref: "vlm" | "lm"): void {
  const err = refErrors.get(`${join(dir, "ckpt", s, l)}:${ref}`);
  expect(err, `${ref} failed on ${s}/${l}`).toBeUndefined();
  using r = loadSafetensors(refOut(s, l, ref));
  const logits = r.tensors.get("logits")!;
  expect(mine.tokens).toEqual(r.tensors.get("tokens")!.tolist() as number[]);
  using stacked = mx.stack(mine.rows, 0);
  expect(stacked.dtype).toBe(logits.dtype);
  expect(maxAbsDiff(stacked, logits)).toBe(0);
}

describe("published configs", () => {
  test("each published config.json parses, and our tensor manifest equals mlx-vlm's language model (names and shapes)", () => {
    SIZES.forEach((s, i) => {
      const cfg = parseGemma4Config(published[s].config, `${s}/config.json`);
      expect(cfg.modelType).toBe(s === "12b" ? "gemma4_unified" : "gemma4");
      const ourManifest = Object.fromEntries([...expectedTensors(cfg, { quantization: null })].map(([n, e]) => [n, e.shape]));
      expect(ourManifest).toEqual(manifests[i]);
    });
  });

  test("gemma4_unified with no text_config fields takes mlx-vlm's gemma4_unified defaults (manifest equal to mlx-vlm's)", () => {
    const cfg = parseGemma4Config({ model_type: "gemma4_unified" });
    expect([cfg.text.hiddenSize, cfg.text.numHiddenLayers, cfg.text.numKeyValueHeads, cfg.text.attentionKEqV]).toEqual([3840, 48, 8, true]);
    const ourManifest = Object.fromEntries([...expectedTensors(cfg, { quantization: null })].map(([n, e]) => [n, e.shape]));
    expect(ourManifest).toEqual(manifests[SIZES.length]);
  });

  test("a bad gemma4_unified field is a ConfigError naming the file and the field", () => {
    expect(() => parseGemma4Config({ model_type: "gemma4_unified", text_config: { num_key_value_heads: 3 } }, "12b/config.json")).toThrow(
      new ConfigError("12b/config.json: text_config.num_key_value_heads must divide num_attention_heads (16), got 3"),
    );
    expect(() => parseGemma4Config({ model_type: "gemma4_unified", text_config: [] }, "12b/config.json")).toThrow(
      new ConfigError("12b/config.json: text_config must be an object, got []"),
    );
  });

  test("a 12B checkpoint whose weights do not fit its config is a WeightsError naming the tensors", () => {
    const bad = join(dir, "12b-bad");
    cpSync(join(dir, "ckpt", "12b", "hf"), bad, { recursive: true });
    const cfg = JSON.parse(readFileSync(join(bad, "config.json"), "utf8"));
    cfg.text_config.num_key_value_heads = 1;
    writeFileSync(join(bad, "config.json"), JSON.stringify(cfg));
    expect(() => loadModel(bad)).toThrow(WeightsError);
    expect(() => loadModel(bad)).toThrow(
      /weights do not match the config: mis-shaped \d+: language_model\.model\.layers\.0\.self_attn\.k_proj\.weight \(expected bfloat16\[32,64\], got bfloat16\[64,64\]\)/,
    );
  });
});

for (const s of SIZES) {
  describe(`${s} (${published[s].hf})`, () => {
    for (const l of layoutsOf(s)) {
      const refs = HAS_MLX_LM(s) ? "mlx-vlm and mlx-lm" : "mlx-vlm";
      test(`${l}: loads; ${STEPS} greedy tokens and every step's logits bit-exact with ${refs}`, () => {
        const mine = ours(join(dir, "ckpt", s, l));
        try {
          compare(mine, s, l, "vlm");
          if (HAS_MLX_LM(s)) compare(mine, s, l, "lm");
          // Vision/audio towers are skipped by name and the loader says so.
          if (l !== "lm-4bit") expect(mine.warnings.join("\n")).toMatch(/^text only: \d+ vision\/audio tensors \(.*embed_vision.*\) are not loaded/m);
        } finally {
          for (const r of mine.rows) r.dispose();
        }
      });
    }
  });
}

describe("memory", () => {
  test("loading and running every size returns MLX active memory and handles to baseline", () => {
    memory.clearCache();
    const base = memory.active();
    const handles = memory.liveHandles();
    for (const s of SIZES) {
      const mine = ours(join(dir, "ckpt", s, "vlm-4bit"));
      for (const r of mine.rows) r.dispose();
    }
    memory.clearCache();
    expect(memory.liveHandles()).toBe(handles);
    expect(memory.active()).toBe(base);
  });
});
