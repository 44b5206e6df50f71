import { copyFileSync, cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import {
  assertTensors,
  checkpointTensorInfo,
  checkTensors,
  expectedTensors,
  findWeights,
  loadGemma4Config,
  loadWeights,
  parseGemma4Config,
  planSanitize,
  WeightsError,
} from "../src/index.ts";
import { astype } from "@mlx-bun/mlx-ops";
import { makeSuite, reference, SUITE, type SuiteName, type TinySuite } from "./helpers.ts";

type Infos = Record<string, [number[], string]>;
let suite: TinySuite;
let scratch: string;
const pySanitized = new Map<SuiteName, Infos>();
const pyParams = new Map<SuiteName, Infos>();

beforeAll(() => {
  suite = makeSuite();
  scratch = mkdtempSync(join(tmpdir(), "mlxb-weights-"));
  const dirs = SUITE.map((n) => suite.path(n));
  reference<Infos[]>("sanitize-many", [], dirs).forEach((r, i) => pySanitized.set(SUITE[i]!, r));
  reference<Infos[]>("params-many", [], dirs).forEach((r, i) => pyParams.set(SUITE[i]!, r));
});
afterAll(() => {
  suite?.cleanup();
  rmSync(scratch, { recursive: true, force: true });
});

const asInfos = (m: Map<string, { shape: number[]; dtype: string }>): Infos => Object.fromEntries([...m].map(([k, v]) => [k, [v.shape, v.dtype]]));
const sorted = (o: Infos) => Object.fromEntries(Object.entries(o).sort(([a], [b]) => (a < b ? -1 : 1)));

describe("sanitize and manifest on every tiny checkpoint", () => {
  test.each(SUITE)("%s: sanitized names/shapes/dtypes equal mlx-lm's sanitize", (name) => {
    const cfg = loadGemma4Config(suite.path(name));
    const { info } = checkpointTensorInfo(findWeights(suite.path(name)), cfg);
    expect(sorted(asInfos(info))).toEqual(sorted(pySanitized.get(name)!));
  });

  test.each(SUITE)("%s: the manifest is exactly the checkpoint's tensors and mlx-lm's model parameters", (name) => {
    const cfg = loadGemma4Config(suite.path(name));
    const { info } = checkpointTensorInfo(findWeights(suite.path(name)), cfg);
    const dtype = name === "moe-f32" ? "float32" : "bfloat16";
    // From the config alone (quantize_model's rule), and with the checkpoint at hand (load_model's rule).
    for (const manifest of [expectedTensors(cfg, { dtype }), expectedTensors(cfg, { dtype, actual: info })]) {
      const check = checkTensors(manifest, info, { strictDtype: true });
      expect(check).toEqual({ missing: [], unexpected: [], mismatched: [], ok: true });
      const m = Object.fromEntries([...manifest].map(([k, v]) => [k, [v.shape, v.dtype]])) as Infos;
      expect(sorted(m)).toEqual(sorted(pyParams.get(name)!));
    }
  });

  test("small-bf16 (Hugging Face names): what sanitize drops and why", () => {
    const cfg = loadGemma4Config(suite.path("small-bf16"));
    const plan = planSanitize(findWeights(suite.path("small-bf16")).tensors.keys(), cfg);
    const dropped = Object.fromEntries(plan.dropped.map((d) => [d.name, d.reason]));
    expect(Object.keys(dropped).sort()).toEqual(
      [
        "model.embed_vision.embedding_projection.weight",
        "model.vision_tower.encoder.layers.0.mlp.gate_proj.input_max",
        "model.vision_tower.encoder.layers.0.mlp.gate_proj.linear.weight",
        ...[4, 5].flatMap((i) => ["k_norm", "k_proj", "v_proj"].map((p) => `model.language_model.layers.${i}.self_attn.${p}.weight`)),
      ].sort(),
    );
    expect(dropped["model.language_model.layers.5.self_attn.k_proj.weight"]).toMatch(/KV-shared layer 5/);
    expect(plan.tensors.get("language_model.model.layers.0.self_attn.q_proj.weight")).toEqual({
      source: "model.language_model.layers.0.self_attn.q_proj.weight",
    });
  });

  test("moe-bf16: fused experts.gate_up_proj splits into gate and up along axis -2", () => {
    const cfg = loadGemma4Config(suite.path("moe-bf16"));
    const files = findWeights(suite.path("moe-bf16"));
    expect(files.tensors.get("model.language_model.layers.1.experts.gate_up_proj")!.info.shape).toEqual([4, 128, 64]);
    const plan = planSanitize(files.tensors.keys(), cfg);
    const base = "language_model.model.layers.1.experts.switch_glu";
    expect(plan.tensors.get(`${base}.gate_proj.weight`)).toEqual({
      source: "model.language_model.layers.1.experts.gate_up_proj",
      split: { axis: -2, parts: 2, index: 0 },
    });
    expect(plan.tensors.get(`${base}.up_proj.weight`)!.split!.index).toBe(1);
    expect(plan.tensors.get(`${base}.down_proj.weight`)).toEqual({ source: "model.language_model.layers.1.experts.down_proj" });
  });

  test("quantized manifest: packed weights, scales and biases; unquantizable modules stay float", () => {
    const m = expectedTensors(loadGemma4Config(suite.path("small-4bit")));
    expect(m.get("language_model.model.layers.0.self_attn.q_proj.weight")).toMatchObject({
      shape: [64, 8],
      dtype: "uint32",
      quant: { groupSize: 64, bits: 4, mode: "affine" },
    });
    expect(m.get("language_model.model.layers.0.self_attn.q_proj.scales")).toMatchObject({ shape: [64, 1], dtype: "bfloat16" });
    // in-dim 16 and 96 do not divide by the group size 64
    expect(m.get("language_model.model.layers.0.per_layer_projection.weight")).toMatchObject({ shape: [64, 16], dtype: "bfloat16" });
    expect(m.get("language_model.model.embed_tokens_per_layer.weight")).toMatchObject({ shape: [512, 96], dtype: "bfloat16" });
    const moe = expectedTensors(loadGemma4Config(suite.path("moe-4bit")));
    expect(moe.get("language_model.model.layers.0.router.proj.weight")).toMatchObject({ shape: [4, 16], dtype: "uint32", quant: { bits: 8 } });
    expect(moe.get("language_model.model.layers.0.experts.switch_glu.down_proj.weight")).toMatchObject({ shape: [4, 64, 8], kind: "switch_linear" });
    // Other modes: uint8 scales, no biases.
    const cfg = parseGemma4Config({
      model_type: "gemma4_text",
      num_hidden_layers: 1,
      num_kv_shared_layers: 0,
      quantization: { group_size: 32, bits: 4, mode: "mxfp4" },
    });
    const mx = expectedTensors(cfg);
    expect(mx.get("model.layers.0.mlp.up_proj.scales")).toMatchObject({ shape: [6144, 48], dtype: "uint8" });
    expect(mx.has("model.layers.0.mlp.up_proj.biases")).toBe(false);
  });
});

describe("manifest check errors name the tensors", () => {
  test("mis-shaped, missing, unexpected", () => {
    const dir = suite.path("small-4bit");
    const cfg = loadGemma4Config(dir);
    const { info } = checkpointTensorInfo(findWeights(dir), cfg);
    const wrong = parseGemma4Config({ ...(cfg.raw as object), text_config: { ...(cfg.raw.text_config as object), intermediate_size: 256 } }, "config.json");
    const check = checkTensors(expectedTensors(wrong), info);
    expect(check.mismatched.map((m) => m.name)).toContain("language_model.model.layers.0.mlp.up_proj.weight");
    expect(check.mismatched.find((m) => m.name === "language_model.model.layers.0.mlp.up_proj.weight")).toEqual({
      name: "language_model.model.layers.0.mlp.up_proj.weight",
      expected: "uint32[256,8]",
      actual: "uint32[128,8]",
    });
    expect(() => assertTensors(check, dir)).toThrow(
      new RegExp(`^${dir.replace(/[/.]/g, "\\$&")}: weights do not match the config: mis-shaped \\d+: language_model`),
    );

    const partial = new Map(info);
    partial.delete("language_model.model.norm.weight");
    partial.set("language_model.model.extra.weight", { shape: [1], dtype: "bfloat16" });
    const c2 = checkTensors(expectedTensors(cfg), partial);
    expect(c2.missing).toEqual(["language_model.model.norm.weight"]);
    expect(c2.unexpected).toEqual(["language_model.model.extra.weight"]);
    expect(() => assertTensors(c2, "ckpt")).toThrow(
      "ckpt: weights do not match the config: missing 1: language_model.model.norm.weight; unexpected 1: language_model.model.extra.weight",
    );
  });

  test("loadWeights throws on a checkpoint that does not match its config", () => {
    const d = join(scratch, "mismatch");
    cpSync(suite.path("small-4bit"), d, { recursive: true });
    const cfgFile = join(d, "config.json");
    const j = JSON.parse(readFileSync(cfgFile, "utf8"));
    j.text_config.hidden_size_per_layer_input = 0;
    writeFileSync(cfgFile, JSON.stringify(j));
    expect(() => loadWeights(d, loadGemma4Config(d))).toThrow(/unexpected \d+: .*embed_tokens_per_layer/);
  });
});

describe("finding weight files", () => {
  function copyOf(name: SuiteName, tag: string): string {
    const d = join(scratch, tag);
    rmSync(d, { recursive: true, force: true });
    cpSync(suite.path(name), d, { recursive: true });
    return d;
  }

  test("single file and shards", () => {
    const single = findWeights(suite.path("small-bf16"));
    expect(single.files.map((f) => f.split("/").pop())).toEqual(["model.safetensors"]);
    expect(single.index).toBeNull();
    const sharded = findWeights(suite.path("dense-bf16"));
    expect(sharded.files.map((f) => f.split("/").pop())).toEqual([
      "model-00001-of-00003.safetensors",
      "model-00002-of-00003.safetensors",
      "model-00003-of-00003.safetensors",
    ]);
    expect(sharded.index!.weightMap.size).toBe(sharded.tensors.size);
  });

  test("corrupt index", () => {
    const d = copyOf("dense-bf16", "corrupt");
    writeFileSync(join(d, "model.safetensors.index.json"), '{"weight_map": {');
    expect(() => findWeights(d)).toThrow(WeightsError);
    expect(() => findWeights(d)).toThrow(`${join(d, "model.safetensors.index.json")}: not valid JSON`);
    writeFileSync(join(d, "model.safetensors.index.json"), '{"weight_map": ["a"]}');
    expect(() => findWeights(d)).toThrow(`${join(d, "model.safetensors.index.json")}: weight_map must be an object of tensor name -> shard file, got ["a"]`);
    writeFileSync(join(d, "model.safetensors.index.json"), '{"weight_map": {"x": "../model.safetensors"}}');
    expect(() => findWeights(d)).toThrow(`weight_map["x"] must be a shard file name in the same folder, got "../model.safetensors"`);
  });

  test("missing shard", () => {
    const d = copyOf("dense-bf16", "missing");
    rmSync(join(d, "model-00002-of-00003.safetensors"));
    expect(() => findWeights(d)).toThrow(/model.safetensors.index.json: shard model-00002-of-00003.safetensors \(holding e.g. 'model\..*'\) is missing from/);
  });

  test("weight_map entry pointing to a shard without that tensor", () => {
    const d = copyOf("dense-bf16", "wrongshard");
    const f = join(d, "model.safetensors.index.json");
    const idx = JSON.parse(readFileSync(f, "utf8"));
    idx.weight_map["model.norm.weight"] =
      idx.weight_map["model.norm.weight"] === "model-00001-of-00003.safetensors" ? "model-00002-of-00003.safetensors" : "model-00001-of-00003.safetensors";
    writeFileSync(f, JSON.stringify(idx));
    expect(() => findWeights(d)).toThrow(
      new RegExp(`weight_map says 'model.norm.weight' is in model-0000\\d-of-00003.safetensors, but .* has no tensor of that name`),
    );
  });

  test("truncated shard names the file", () => {
    const d = copyOf("dense-bf16", "truncated");
    const f = join(d, "model-00001-of-00003.safetensors");
    writeFileSync(f, readFileSync(f).subarray(0, 100));
    expect(() => findWeights(d)).toThrow(WeightsError);
    expect(() => findWeights(d)).toThrow(f);
  });

  test("no index: model*.safetensors, duplicates are an error, none at all is an error", () => {
    const d = copyOf("dense-bf16", "noindex");
    rmSync(join(d, "model.safetensors.index.json"));
    expect(findWeights(d).tensors.size).toBe(findWeights(suite.path("dense-bf16")).tensors.size);
    copyFileSync(join(d, "model-00001-of-00003.safetensors"), join(d, "model-extra.safetensors"));
    expect(() => findWeights(d)).toThrow(/tensor '.*' is in both model-00001-of-00003.safetensors and model-extra.safetensors/);
    const empty = join(scratch, "empty");
    mkdirSync(empty, { recursive: true });
    expect(() => findWeights(empty)).toThrow(`${empty}: no model.safetensors, model.safetensors.index.json or model*.safetensors`);
    expect(() => findWeights(join(scratch, "absent"))).toThrow(`${join(scratch, "absent")}: folder not found`);
  });
});

describe("loadWeights", () => {
  test("lazily loads sanitized arrays", () => {
    const dir = suite.path("small-4bit");
    using w = loadWeights(dir, loadGemma4Config(dir));
    expect(w.tensors.size).toBe(Object.keys(pyParams.get("small-4bit")!).length);
    const a = w.tensors.get("language_model.model.layers.0.self_attn.q_proj.weight")!;
    expect(a.shape).toEqual([64, 8]);
    expect(a.dtype).toBe("uint32");
  });

  test("Hugging Face names load sanitized (dense-bf16, text form)", () => {
    const dir = suite.path("dense-bf16");
    using w = loadWeights(dir, loadGemma4Config(dir));
    expect(w.tensors.has("lm_head.weight")).toBe(true);
    expect(w.tensors.get("model.layers.3.self_attn.k_proj.weight")!.shape).toEqual([64, 64]);
  });

  test("a fused gate_up_proj is split into gate and up (same values as the mlx-named checkpoint)", () => {
    const dir = suite.path("moe-bf16");
    using w = loadWeights(dir, loadGemma4Config(dir));
    // moe-f32 holds the same seeded values (float32, mlx-lm names): compare after a cast to bf16.
    using ref = loadWeights(suite.path("moe-f32"), loadGemma4Config(suite.path("moe-f32")));
    for (const p of ["gate_proj", "up_proj", "down_proj"]) {
      const name = `language_model.model.layers.1.experts.switch_glu.${p}.weight`;
      const a = w.tensors.get(name)!;
      expect(a.shape).toEqual([4, 64, 64]);
      using b = astype(ref.tensors.get(name)!, "bfloat16");
      expect(Array.from(a.toTypedArray() as Uint16Array)).toEqual(Array.from(b.toTypedArray() as Uint16Array));
    }
  });
});
