import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { ConfigError, type Gemma4Config, layerSpecs, loadGemma4Config, parseGemma4Config, parseQuantization, readJson } from "../src/index.ts";
import { makeSuite, reference, SUITE, type TinySuite } from "./helpers.ts";

let suite: TinySuite;
let scratch: string;
// mlx-lm's answers for every suite checkpoint and every default case, from one Python process.
const py = new Map<string, PyArgs>();
beforeAll(() => {
  suite = makeSuite();
  scratch = mkdtempSync(join(tmpdir(), "mlxb-config-"));
  const items = [...SUITE.map((n) => ({ key: n, dir: suite.path(n) })), ...Object.entries(defaultCases).map(([key, config]) => ({ key, config }))];
  const out = reference<PyArgs[]>(
    "args-many",
    [],
    items.map(({ key: _k, ...rest }) => rest),
  );
  items.forEach((it, i) => py.set(it.key, out[i]!));
});
afterAll(() => {
  suite?.cleanup();
  rmSync(scratch, { recursive: true, force: true });
});

const camel = (s: string) => s.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());

interface PyLayer {
  type: string;
  head_dim: number;
  n_heads: number;
  n_kv_heads: number;
  has_kv: boolean;
  use_k_eq_v: boolean;
  kv_source: number;
  mlp_intermediate: number;
  rope: { class: string; dims: number; traditional: boolean; base?: number; scale?: number; n_finite?: number; freqs?: number[] };
}
interface PyArgs {
  fields: Record<string, unknown>;
  layers: PyLayer[];
  window: number;
}

/** Every ModelArgs field and every per-layer fact equals what mlx-lm derives from the same config. */
function expectMatchesPython(cfg: Gemma4Config, py: PyArgs) {
  const t = cfg.text as unknown as Record<string, unknown>;
  for (const [k, v] of Object.entries(py.fields)) {
    const key = camel(k);
    expect(Object.hasOwn(t, key), `field ${k} -> ${key}`).toBe(true);
    if (k === "rope_parameters") continue; // normalized; checked through the per-layer RoPE below
    if (k === "global_head_dim" && !v) {
      expect(t[key]).toBeNull();
      continue;
    }
    if (k === "hidden_size_per_layer_input" && v === null) {
      expect(t[key]).toBe(0);
      continue;
    }
    expect(t[key], k).toEqual(v);
  }
  expect(Object.keys(t).length).toBe(Object.keys(py.fields).length);
  const specs = layerSpecs(cfg.text);
  expect(specs.length).toBe(py.layers.length);
  specs.forEach((s, i) => {
    const p = py.layers[i]!;
    expect(
      { type: s.type, headDim: s.headDim, nHeads: s.numHeads, nKv: s.numKvHeads, hasKv: s.hasKv, kEqV: s.kEqV, src: s.kvSource, mlp: s.mlpIntermediateSize },
      `layer ${i}`,
    ).toEqual({
      type: p.type,
      headDim: p.head_dim,
      nHeads: p.n_heads,
      nKv: p.n_kv_heads,
      hasKv: p.has_kv,
      kEqV: p.use_k_eq_v,
      src: p.kv_source,
      mlp: p.mlp_intermediate,
    });
    expect(s.rope.dims).toBe(p.rope.dims);
    expect(s.rope.traditional).toBe(p.rope.traditional);
    if (p.rope.class === "ProportionalRoPE") {
      expect(s.rope.type).toBe("proportional");
      expect(s.rope.rotatedDims / 2).toBe(p.rope.n_finite);
      // freqs = factor * theta ** (arange(0, rotated, 2) / dims) (rope_utils.py:214-220), in float32.
      const ours = Array.from({ length: s.rope.rotatedDims / 2 }, (_, j) => Math.fround(s.rope.factor * s.rope.theta ** ((2 * j) / s.rope.dims)));
      ours.forEach((f, j) => expect(f / p.rope.freqs![j]!).toBeCloseTo(1, 5));
    } else {
      expect(p.rope.class).toBe("RoPE");
      expect(s.rope.theta).toBe(p.rope.base);
      expect(s.rope.scale).toBe(p.rope.scale);
    }
    expect(s.window).toBe(s.type === "sliding_attention" ? py.window : null);
  });
}

describe("config.json of the tiny checkpoints", () => {
  test.each(SUITE)("%s: fields and per-layer facts equal mlx-lm's", (name) => {
    const cfg = loadGemma4Config(suite.path(name));
    expectMatchesPython(cfg, py.get(name)!);
  });

  test("wrapper and text forms", () => {
    const w = loadGemma4Config(suite.path("small-bf16"));
    expect(w.form).toBe("wrapper");
    expect(w.modelType).toBe("gemma4");
    expect(w.prefix).toBe("language_model.");
    const t = loadGemma4Config(suite.path("dense-bf16"));
    expect(t.form).toBe("text");
    expect(t.prefix).toBe("");
    expect(t.text.tieWordEmbeddings).toBe(false);
    expect(t.text.attentionKEqV).toBe(true);
  });

  test("small: KV sharing, per-layer embeddings and RoPE per layer type", () => {
    const specs = layerSpecs(loadGemma4Config(suite.path("small-bf16")).text);
    expect(specs.map((s) => s.kvSource)).toEqual([0, 1, 2, 3, 3, 2]);
    expect(specs.map((s) => s.hasKv)).toEqual([true, true, true, true, false, false]);
    expect(specs.map((s) => s.mlpIntermediateSize)).toEqual([128, 128, 128, 128, 256, 256]);
    expect(specs[2]!.rope).toMatchObject({ type: "proportional", dims: 64, rotatedDims: 16, theta: 1e6 });
    expect(specs[0]!.rope).toMatchObject({ type: "default", dims: 32, theta: 1e4, scale: 1 });
  });

  test("eos_token_id: generation_config.json replaces config.json's", () => {
    const cfg = loadGemma4Config(suite.path("small-bf16"));
    const raw = readJson(join(suite.path("small-bf16"), "generation_config.json")) as { eos_token_id: number[] };
    expect(cfg.eosTokenIds).toEqual(raw.eos_token_id);
    expect(parseGemma4Config({ model_type: "gemma4_text", eos_token_id: 7 }).eosTokenIds).toEqual([7]);
  });
});

const defaultCases: Record<string, unknown> = {
  "text form, nothing set": { model_type: "gemma4_text" },
  "wrapper, empty text_config": { model_type: "gemma4", text_config: {} },
  "no layer_types: pattern": { model_type: "gemma4_text", num_hidden_layers: 7, sliding_window_pattern: 3, num_kv_shared_layers: 2 },
  "rope_parameters missing a layer type": {
    model_type: "gemma4_text",
    num_kv_shared_layers: 0,
    rope_parameters: { full_attention: { rope_type: "proportional", partial_rotary_factor: 0.5, rope_theta: 5000, factor: 2 } },
  },
  "linear rope, nulls": {
    model_type: "gemma4_text",
    num_hidden_layers: 4,
    num_kv_shared_layers: 0,
    global_head_dim: null,
    hidden_size_per_layer_input: null,
    final_logit_softcapping: null,
    rope_parameters: { sliding_attention: { type: "linear", factor: 4, rope_theta: 100 }, full_attention: { rope_type: "default" } },
  },
  "wrapper vocab override": { model_type: "gemma4", vocab_size: 1000, text_config: { vocab_size: 5, num_kv_shared_layers: 0 } },
};

describe("defaults equal mlx-lm's ModelArgs", () => {
  test.each(Object.keys(defaultCases))("%s", (name) => {
    expectMatchesPython(parseGemma4Config(defaultCases[name], "config.json"), py.get(name)!);
  });

  test("wrapper: the top-level vocab_size wins (default 262144), with a warning", () => {
    const c = parseGemma4Config({ model_type: "gemma4", text_config: { vocab_size: 512 } });
    expect(c.text.vocabSize).toBe(262144);
    expect(c.warnings.join("\n")).toMatch(/text_config.vocab_size \(512\) differs from vocab_size \(262144\)/);
  });
});

describe("bad fields name the field and the file", () => {
  const T = (extra: Record<string, unknown>) => ({ model_type: "gemma4", text_config: { num_kv_shared_layers: 0, ...extra } });
  const cases: [string, unknown, string][] = [
    ["string for an int", T({ num_attention_heads: "8" }), 'config.json: text_config.num_attention_heads must be a positive integer, got "8"'],
    ["zero heads", T({ num_attention_heads: 0 }), "config.json: text_config.num_attention_heads must be a positive integer, got 0"],
    ["float layers", T({ num_hidden_layers: 2.5 }), "config.json: text_config.num_hidden_layers must be a positive integer, got 2.5"],
    ["null hidden", T({ hidden_size: null }), "config.json: text_config.hidden_size must be a positive integer, got null"],
    ["negative shared", T({ num_kv_shared_layers: -1 }), "config.json: text_config.num_kv_shared_layers must be an integer >= 0, got -1"],
    ["eps", T({ rms_norm_eps: "1e-6" }), 'config.json: text_config.rms_norm_eps must be a number, got "1e-6"'],
    ["eps zero", T({ rms_norm_eps: 0 }), "config.json: text_config.rms_norm_eps must be a positive number, got 0"],
    ["bool", T({ attention_k_eq_v: "yes" }), 'config.json: text_config.attention_k_eq_v must be true or false, got "yes"'],
    ["softcap", T({ final_logit_softcapping: -1 }), "config.json: text_config.final_logit_softcapping must be a positive number or null, got -1"],
    [
      "layer_types length",
      T({ num_hidden_layers: 2, layer_types: ["full_attention"] }),
      'config.json: text_config.layer_types must have num_hidden_layers (2) entries, got "1 entries"',
    ],
    [
      "layer type",
      T({ num_hidden_layers: 1, layer_types: ["local"] }),
      'config.json: text_config.layer_types[0] must be one of sliding_attention, full_attention, got "local"',
    ],
    [
      "rope type",
      T({ rope_parameters: { full_attention: { rope_type: "yarn" } } }),
      'config.json: text_config.rope_parameters.full_attention.rope_type must be "default", "linear" or "proportional" (the RoPE kinds a Gemma 4 port supports), got "yarn"',
    ],
    [
      "rope key",
      T({ rope_parameters: { global: {} } }),
      'config.json: text_config.rope_parameters.global is not a layer type (sliding_attention, full_attention), got "global"',
    ],
    [
      "rope theta",
      T({ rope_parameters: { sliding_attention: { rope_theta: "big" } } }),
      'config.json: text_config.rope_parameters.sliding_attention.rope_theta must be a number, got "big"',
    ],
    [
      "moe without experts",
      T({ enable_moe_block: true, top_k_experts: 2, moe_intermediate_size: 8 }),
      "config.json: text_config.num_experts must be a positive integer when enable_moe_block is true, got nothing",
    ],
    [
      "top-k > experts",
      T({ enable_moe_block: true, num_experts: 2, top_k_experts: 3, moe_intermediate_size: 8 }),
      "config.json: text_config.top_k_experts must be at most num_experts (2), got 3",
    ],
    [
      "all layers shared",
      T({ num_hidden_layers: 2, num_kv_shared_layers: 2 }),
      "config.json: text_config.num_kv_shared_layers must be less than num_hidden_layers (2), got 2",
    ],
    [
      "shared type without owner",
      T({ num_hidden_layers: 3, num_kv_shared_layers: 1, layer_types: ["sliding_attention", "sliding_attention", "full_attention"] }),
      'config.json: text_config.layer_types[2] is a KV-shared layer of a type no earlier layer (0..1) computes K/V for, got "full_attention"',
    ],
    [
      "kv heads",
      T({ num_attention_heads: 4, num_key_value_heads: 3 }),
      "config.json: text_config.num_key_value_heads must divide num_attention_heads (4), got 3",
    ],
    ["text_config type", { model_type: "gemma4", text_config: [] }, "config.json: text_config must be an object, got []"],
    ["top vocab", { model_type: "gemma4", vocab_size: "big" }, 'config.json: vocab_size must be a positive integer, got "big"'],
    ["text form path", { model_type: "gemma4_text", head_dim: -4 }, "config.json: head_dim must be a positive integer, got -4"],
    [
      "eos",
      { model_type: "gemma4_text", num_kv_shared_layers: 0, eos_token_id: [1, "x"] },
      'config.json: eos_token_id[1] must be a token id (a non-negative integer) or a list of them, got "x"',
    ],
    [
      "unknown model_type",
      { model_type: "llama" },
      'config.json: model_type "llama" is not a Gemma 4 model (expected "gemma4" for the multimodal wrapper, "gemma4_unified" for the 12B or "gemma4_text")',
    ],
    [
      "no model_type",
      {},
      'config.json: model_type nothing is not a Gemma 4 model (expected "gemma4" for the multimodal wrapper, "gemma4_unified" for the 12B or "gemma4_text")',
    ],
    ["not an object", [1], "config.json: must be a JSON object, got [1]"],
    [
      "quant bits",
      { model_type: "gemma4_text", num_kv_shared_layers: 0, quantization: { group_size: 64, bits: 7 } },
      "config.json: quantization.bits must be one of 2, 3, 4, 5, 6, 8 for mode affine, got 7",
    ],
    [
      "quant group",
      { model_type: "gemma4_text", num_kv_shared_layers: 0, quantization: { group_size: 48, bits: 4 } },
      "config.json: quantization.group_size must be one of 32, 64, 128 for mode affine, got 48",
    ],
    [
      "quant mode",
      { model_type: "gemma4_text", num_kv_shared_layers: 0, quantization: { group_size: 64, bits: 4, mode: "fp3" } },
      'config.json: quantization.mode must be one of affine, mxfp4, nvfp4, mxfp8, got "fp3"',
    ],
    [
      "quant missing bits",
      { model_type: "gemma4_text", num_kv_shared_layers: 0, quantization: { group_size: 64 } },
      "config.json: quantization.bits is required, got nothing",
    ],
    [
      "quant override",
      { model_type: "gemma4_text", num_kv_shared_layers: 0, quantization: { group_size: 64, bits: 4, "model.layers.0.mlp.up_proj": { bits: 9 } } },
      "config.json: quantization.model.layers.0.mlp.up_proj.bits must be one of 2, 3, 4, 5, 6, 8 for mode affine, got 9",
    ],
    [
      "quant override type",
      { model_type: "gemma4_text", num_kv_shared_layers: 0, quantization: { group_size: 64, bits: 4, "model.norm": 3 } },
      "config.json: quantization.model.norm must be a per-module quantization object or false, got 3",
    ],
    [
      "hf quant method",
      { model_type: "gemma4_text", num_kv_shared_layers: 0, quantization_config: { quant_method: "awq", bits: 4 } },
      'config.json: quantization_config.quant_method is a Hugging Face quantization format; only MLX-quantized checkpoints (a "quantization" block with group_size/bits) are supported, got "awq"',
    ],
  ];
  test.each(cases)("%s", (_name, json, message) => {
    let err: unknown;
    try {
      parseGemma4Config(json, "config.json");
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(ConfigError);
    expect((err as Error).message).toBe(message);
  });

  test("a missing or broken file names the path", () => {
    expect(() => loadGemma4Config(join(scratch, "nope"))).toThrow(`${join(scratch, "nope", "config.json")}: file not found`);
    const d = join(scratch, "broken");
    rmSync(d, { recursive: true, force: true });
    mkdirSync(d);
    writeFileSync(join(d, "config.json"), "{not json");
    expect(() => loadGemma4Config(d)).toThrow(new RegExp(`${join(d, "config.json").replace(/[/.]/g, "\\$&")}: not valid JSON`));
  });
});

describe("quantization block", () => {
  test("4-bit checkpoints: default and the MoE router's per-module override", () => {
    const small = loadGemma4Config(suite.path("small-4bit")).quantization!;
    expect({ g: small.groupSize, b: small.bits, m: small.mode, n: small.overrides.size }).toEqual({ g: 64, b: 4, m: "affine", n: 0 });
    const moe = loadGemma4Config(suite.path("moe-4bit")).quantization!;
    expect(moe.overrides.size).toBe(4);
    // {"group_size": 64, "bits": 8} has no "mode": affine, as mlx's to_quantized default.
    expect(moe.overrides.get("language_model.model.layers.2.router.proj")).toEqual({ groupSize: 64, bits: 8, mode: "affine" });
  });

  test("mixed recipe: an entry for every quantized module", () => {
    const raw = readJson(join(suite.path("dense-mixed"), "config.json")) as { quantization: Record<string, unknown> };
    const q = loadGemma4Config(suite.path("dense-mixed")).quantization!;
    expect(q.overrides.size).toBe(Object.keys(raw.quantization).length - 3);
    expect(q.overrides.get("lm_head")).toEqual({ groupSize: 64, bits: 6, mode: "affine" });
    expect([...q.overrides.values()].some((v) => v && v.bits === 4)).toBe(true);
  });

  test("false, true, mode defaults, quantization_config fallback", () => {
    const q = parseQuantization({ group_size: 32, bits: 8, mode: "affine", a: false, b: true, c: { mode: "mxfp4" }, d: { bits: 2 } });
    expect(q.overrides.get("a")).toBe(false);
    expect(q.overrides.get("b")).toEqual({ groupSize: 32, bits: 8, mode: "affine" });
    expect(q.overrides.get("c")).toEqual({ groupSize: 32, bits: 4, mode: "mxfp4" });
    expect(q.overrides.get("d")).toEqual({ groupSize: 64, bits: 2, mode: "affine" });
    const viaConfig = parseGemma4Config({ model_type: "gemma4", text_config: { quantization_config: { group_size: 128, bits: 4 } } });
    expect(viaConfig.quantization).toMatchObject({ groupSize: 128, bits: 4, mode: "affine" });
    expect(parseGemma4Config({ model_type: "gemma4_text" }).quantization).toBeNull();
  });
});
