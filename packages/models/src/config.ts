// Gemma 4 config.json: the multimodal wrapper ({"model_type": "gemma4", "text_config": {...}}),
// the 12B's unified wrapper ({"model_type": "gemma4_unified", ...}) and the text-only form
// ({"model_type": "gemma4_text", ...}) parsed into one typed, fully-defaulted Gemma4TextConfig with
// exactly the fields and defaults of mlx-lm's gemma4_text.ModelArgs (mlx_lm/models/gemma4_text.py:16-70,
// gemma4.py:13-28) — for gemma4_unified, which mlx-lm lacks, mlx-vlm 0.7.10's defaults
// (mlx_vlm/models/gemma4_unified/config.py TextConfig) — plus the "quantization" block.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { ConfigError } from "./errors.ts";
import { assertRegularFile } from "./files.ts";

export type LayerType = "sliding_attention" | "full_attention";
export const LAYER_TYPES: readonly LayerType[] = ["sliding_attention", "full_attention"];

/** RoPE kinds mlx-lm's initialize_rope builds that a Gemma 4 config can name. */
export type RopeType = "default" | "linear" | "proportional";

/** One entry of rope_parameters (keyed by layer type), with mlx-lm's defaults applied. */
export interface RopeParameters {
  /** rope_parameters[t].type ?? rope_type ?? "default" (rope_utils.py:299). */
  ropeType: RopeType;
  /** rope_theta, default 10000 (gemma4_text.py:224). */
  ropeTheta: number;
  /** partial_rotary_factor (proportional only), default 1.0 (rope_utils.py:361). */
  partialRotaryFactor: number;
  /** factor: proportional's frequency multiplier (default 1.0) or linear's position divisor. */
  factor: number;
}

/**
 * Every field mlx-lm's gemma4_text.ModelArgs reads, camelCased, with its defaults
 * (JSON key in the comment). Nullable fields are null where Python has None.
 */
export interface Gemma4TextConfig {
  /** model_type ("gemma4_text"). */
  modelType: string;
  /** hidden_size = 1536 */
  hiddenSize: number;
  /** num_hidden_layers = 35 */
  numHiddenLayers: number;
  /** intermediate_size = 6144 (doubled on KV-shared layers when useDoubleWideMlp) */
  intermediateSize: number;
  /** num_attention_heads = 8 */
  numAttentionHeads: number;
  /** head_dim = 256 (sliding layers; full layers too when globalHeadDim is falsy) */
  headDim: number;
  /** global_head_dim = 512 (full-attention layers); null/0 means "use headDim" */
  globalHeadDim: number | null;
  /** global_partial_rotary_factor = 0.25 (read by ModelArgs, unused by the forward pass) */
  globalPartialRotaryFactor: number;
  /** rms_norm_eps = 1e-6 */
  rmsNormEps: number;
  /** vocab_size = 262144 (wrapper form: the top-level vocab_size, see parseGemma4Config) */
  vocabSize: number;
  /** vocab_size_per_layer_input = 262144 */
  vocabSizePerLayerInput: number | null;
  /** num_key_value_heads = 1 */
  numKeyValueHeads: number;
  /** num_global_key_value_heads = null (kv heads of full layers when attentionKEqV) */
  numGlobalKeyValueHeads: number | null;
  /** num_kv_shared_layers = 20 */
  numKvSharedLayers: number;
  /** pad_token_id = 0 */
  padTokenId: number;
  /** hidden_size_per_layer_input = 256; 0 (or null) turns per-layer embeddings off */
  hiddenSizePerLayerInput: number;
  /** rope_traditional = false */
  ropeTraditional: boolean;
  /** partial_rotary_factor = 1.0 (read by ModelArgs, unused by the forward pass) */
  partialRotaryFactor: number;
  /** rope_parameters, per layer type; default {full: proportional 1e6 x0.25, sliding: default 1e4} */
  ropeParameters: Record<LayerType, RopeParameters>;
  /** sliding_window = 512 */
  slidingWindow: number;
  /** sliding_window_pattern = 5 (only used to build layerTypes when the config has none) */
  slidingWindowPattern: number;
  /** max_position_embeddings = 131072 */
  maxPositionEmbeddings: number;
  /** attention_k_eq_v = false (full layers: values = keys, no v_proj) */
  attentionKEqV: boolean;
  /** final_logit_softcapping = 30.0; null turns soft-capping off */
  finalLogitSoftcapping: number | null;
  /** use_double_wide_mlp = true */
  useDoubleWideMlp: boolean;
  /** enable_moe_block = false */
  enableMoeBlock: boolean;
  /** num_experts = null */
  numExperts: number | null;
  /** top_k_experts = null */
  topKExperts: number | null;
  /** moe_intermediate_size = null */
  moeIntermediateSize: number | null;
  /** layer_types; default: (pattern-1) sliding then one full, repeated (gemma4_text.py:64-70) */
  layerTypes: LayerType[];
  /** tie_word_embeddings = true */
  tieWordEmbeddings: boolean;
}

/** Quantization mode of mx.quantize. */
export type QuantMode = "affine" | "mxfp4" | "nvfp4" | "mxfp8";
const QUANT_MODE_DEFAULTS: Record<QuantMode, { groupSize: number; bits: number }> = {
  affine: { groupSize: 64, bits: 4 },
  mxfp4: { groupSize: 32, bits: 4 },
  nvfp4: { groupSize: 16, bits: 4 },
  mxfp8: { groupSize: 32, bits: 8 },
};

export interface QuantParams {
  groupSize: number;
  bits: number;
  mode: QuantMode;
}

/** config.json "quantization": the default and the per-module entries (module path → params, or false = not quantized). */
export interface QuantizationConfig extends QuantParams {
  overrides: Map<string, QuantParams | false>;
}

/** A parsed Gemma 4 config.json. */
export interface Gemma4Config {
  /** "wrapper": {"model_type": "gemma4" | "gemma4_unified", "text_config": ...}; "text": {"model_type": "gemma4_text", ...}. */
  form: "wrapper" | "text";
  /** gemma4_unified: the 12B (encoder-free multimodal); mlx-vlm's naming and defaults apply. */
  modelType: "gemma4" | "gemma4_unified" | "gemma4_text";
  text: Gemma4TextConfig;
  /** Module-path prefix of the language model in mlx-lm's tree: "language_model." (wrapper) or "". */
  prefix: string;
  /** config.json eos_token_id (int or list), normalized to a list; generation_config.json overrides it in loadGemma4Config. */
  eosTokenIds: number[];
  quantization: QuantizationConfig | null;
  /** Things mlx-lm accepts but treats differently from transformers (one line each). */
  warnings: string[];
  /** The file the config came from (for messages). */
  source: string;
  raw: Record<string, unknown>;
}

type Json = Record<string, unknown>;

class Reader {
  constructor(
    readonly file: string,
    readonly obj: Json,
    readonly path: string,
  ) {}

  private where(key: string): string {
    return `${this.file}: ${this.path}${key}`;
  }

  fail(key: string, what: string, got: unknown): never {
    throw new ConfigError(`${this.where(key)} ${what}, got ${fmt(got)}`);
  }

  has(key: string): boolean {
    return Object.hasOwn(this.obj, key);
  }

  /** Present and not null. */
  given(key: string): boolean {
    return this.has(key) && this.obj[key] !== null;
  }

  int(key: string, def: number, opts: { min?: number; nullable?: false }): number;
  int(key: string, def: number | null, opts: { min?: number; nullable: true }): number | null;
  int(key: string, def: number | null, opts: { min?: number; nullable?: boolean }): number | null {
    if (!this.has(key)) return def;
    const v = this.obj[key];
    if (v === null && opts.nullable) return null;
    const min = opts.min ?? 1;
    if (typeof v !== "number" || !Number.isInteger(v) || v < min) {
      this.fail(key, min === 1 ? "must be a positive integer" : `must be an integer >= ${min}`, v);
    }
    return v;
  }

  num(key: string, def: number, opts: { positive?: boolean; max?: number } = {}): number {
    if (!this.has(key)) return def;
    const v = this.obj[key];
    if (typeof v !== "number" || !Number.isFinite(v)) this.fail(key, "must be a number", v);
    if (opts.positive && !(v > 0)) this.fail(key, "must be a positive number", v);
    if (opts.max !== undefined && v > opts.max) this.fail(key, `must be at most ${opts.max}`, v);
    return v;
  }

  nullableNum(key: string, def: number | null): number | null {
    if (!this.has(key) || this.obj[key] === null) return this.has(key) ? null : def;
    const v = this.obj[key];
    if (typeof v !== "number" || !Number.isFinite(v) || v <= 0) this.fail(key, "must be a positive number or null", v);
    return v;
  }

  bool(key: string, def: boolean): boolean {
    if (!this.has(key)) return def;
    const v = this.obj[key];
    if (typeof v !== "boolean") this.fail(key, "must be true or false", v);
    return v;
  }

  sub(key: string, obj: Json): Reader {
    return new Reader(this.file, obj, `${this.path}${key}.`);
  }
}

function fmt(v: unknown): string {
  if (v === undefined) return "nothing";
  const s = JSON.stringify(v);
  return s.length > 80 ? `${s.slice(0, 77)}...` : s;
}

function isObject(v: unknown): v is Json {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

const DEFAULT_ROPE: Record<LayerType, RopeParameters> = {
  full_attention: { ropeType: "proportional", ropeTheta: 1_000_000, partialRotaryFactor: 0.25, factor: 1 },
  sliding_attention: { ropeType: "default", ropeTheta: 10_000, partialRotaryFactor: 1, factor: 1 },
};

function parseRope(r: Reader, key: string): Record<LayerType, RopeParameters> {
  if (!r.given(key)) return structuredClone(DEFAULT_ROPE);
  const v = r.obj[key];
  if (!isObject(v)) r.fail(key, "must be an object keyed by layer type", v);
  const out = {} as Record<LayerType, RopeParameters>;
  for (const k of Object.keys(v)) {
    if (!(LAYER_TYPES as readonly string[]).includes(k)) r.fail(`${key}.${k}`, `is not a layer type (${LAYER_TYPES.join(", ")})`, k);
  }
  const rr: Reader = r.sub(key, v);
  for (const t of LAYER_TYPES) {
    // A missing entry is {} in mlx-lm (gemma4_text.py:223): default RoPE, theta 10000.
    const e: unknown = v[t] ?? {};
    if (!isObject(e)) rr.fail(t, "must be an object", e);
    const er: Reader = rr.sub(t, e);
    const typeKey = er.given("type") ? "type" : "rope_type";
    const ropeType = er.given(typeKey) ? er.obj[typeKey] : "default";
    if (ropeType !== "default" && ropeType !== "linear" && ropeType !== "proportional") {
      er.fail(typeKey, 'must be "default", "linear" or "proportional" (the RoPE kinds a Gemma 4 port supports)', ropeType);
    }
    if (ropeType === "linear" && !er.given("factor")) er.fail("factor", "is required for linear RoPE", undefined);
    out[t] = {
      ropeType,
      ropeTheta: er.num("rope_theta", 10_000, { positive: true }),
      partialRotaryFactor: er.num("partial_rotary_factor", 1, { positive: true, max: 1 }),
      factor: er.num("factor", 1, { positive: true }),
    };
  }
  return out;
}

function parseLayerTypes(r: Reader, n: number, pattern: number): LayerType[] {
  if (!r.given("layer_types")) {
    // gemma4_text.py:64-70: (pattern - 1) sliding layers then one full layer, repeated.
    const p: LayerType[] = [...Array<LayerType>(pattern - 1).fill("sliding_attention"), "full_attention"];
    const out: LayerType[] = [];
    while (out.length < n) out.push(...p);
    return out.slice(0, n);
  }
  const v = r.obj.layer_types;
  if (!Array.isArray(v)) r.fail("layer_types", "must be a list of layer types", v);
  if (v.length !== n) r.fail("layer_types", `must have num_hidden_layers (${n}) entries`, `${v.length} entries`);
  v.forEach((t, i) => {
    if (!(LAYER_TYPES as readonly unknown[]).includes(t)) r.fail(`layer_types[${i}]`, `must be one of ${LAYER_TYPES.join(", ")}`, t);
  });
  return v as LayerType[];
}

/** The text-config defaults that differ between mlx-lm's gemma4_text.ModelArgs and mlx-vlm's gemma4_unified TextConfig. */
interface TextDefaults {
  hiddenSize: number;
  numHiddenLayers: number;
  intermediateSize: number;
  numAttentionHeads: number;
  numKeyValueHeads: number;
  numGlobalKeyValueHeads: number | null;
  numKvSharedLayers: number;
  hiddenSizePerLayerInput: number;
  slidingWindow: number;
  slidingWindowPattern: number;
  attentionKEqV: boolean;
  useDoubleWideMlp: boolean;
}

/** mlx-lm 0.32.2 gemma4_text.ModelArgs (:16-70). */
const LM_TEXT_DEFAULTS: TextDefaults = {
  hiddenSize: 1536,
  numHiddenLayers: 35,
  intermediateSize: 6144,
  numAttentionHeads: 8,
  numKeyValueHeads: 1,
  numGlobalKeyValueHeads: null,
  numKvSharedLayers: 20,
  hiddenSizePerLayerInput: 256,
  slidingWindow: 512,
  slidingWindowPattern: 5,
  attentionKEqV: false,
  useDoubleWideMlp: true,
};

/** mlx-vlm 0.7.10 gemma4_unified TextConfig (config.py:38-59); other fields inherit gemma4's, equal to mlx-lm's. */
const UNIFIED_TEXT_DEFAULTS: TextDefaults = {
  hiddenSize: 3840,
  numHiddenLayers: 48,
  intermediateSize: 15360,
  numAttentionHeads: 16,
  numKeyValueHeads: 8,
  numGlobalKeyValueHeads: 1,
  numKvSharedLayers: 0,
  hiddenSizePerLayerInput: 0,
  slidingWindow: 1024,
  slidingWindowPattern: 6,
  attentionKEqV: true,
  useDoubleWideMlp: false,
};

/** Parse the text model's fields (text_config of the wrapper, or the text-only config itself). */
function parseTextConfig(
  r: Reader,
  overrides: Partial<Record<string, unknown>> = {},
  D: TextDefaults = LM_TEXT_DEFAULTS,
): { cfg: Gemma4TextConfig; warnings: string[] } {
  const warnings: string[] = [];
  const numHiddenLayers = r.int("num_hidden_layers", D.numHiddenLayers, {});
  const slidingWindowPattern = r.int("sliding_window_pattern", D.slidingWindowPattern, {});
  const hiddenSizePerLayerInput = r.int("hidden_size_per_layer_input", D.hiddenSizePerLayerInput, { min: 0, nullable: true }) ?? 0;
  let globalHeadDim = r.int("global_head_dim", 512, { min: 0, nullable: true });
  if (globalHeadDim === 0) globalHeadDim = null;
  const cfg: Gemma4TextConfig = {
    modelType: typeof r.obj.model_type === "string" ? r.obj.model_type : "gemma4_text",
    hiddenSize: r.int("hidden_size", D.hiddenSize, {}),
    numHiddenLayers,
    intermediateSize: r.int("intermediate_size", D.intermediateSize, {}),
    numAttentionHeads: r.int("num_attention_heads", D.numAttentionHeads, {}),
    headDim: r.int("head_dim", 256, {}),
    globalHeadDim,
    globalPartialRotaryFactor: r.num("global_partial_rotary_factor", 0.25, { positive: true, max: 1 }),
    rmsNormEps: r.num("rms_norm_eps", 1e-6, { positive: true }),
    vocabSize: (overrides.vocab_size as number | undefined) ?? r.int("vocab_size", 262144, {}),
    vocabSizePerLayerInput: r.int("vocab_size_per_layer_input", 262144, { nullable: true }),
    numKeyValueHeads: r.int("num_key_value_heads", D.numKeyValueHeads, {}),
    numGlobalKeyValueHeads: r.int("num_global_key_value_heads", D.numGlobalKeyValueHeads, { nullable: true }),
    numKvSharedLayers: r.int("num_kv_shared_layers", D.numKvSharedLayers, { min: 0 }),
    padTokenId: r.int("pad_token_id", 0, { min: 0 }),
    hiddenSizePerLayerInput,
    ropeTraditional: r.bool("rope_traditional", false),
    partialRotaryFactor: r.num("partial_rotary_factor", 1, { positive: true, max: 1 }),
    ropeParameters: parseRope(r, "rope_parameters"),
    slidingWindow: r.int("sliding_window", D.slidingWindow, {}),
    slidingWindowPattern,
    maxPositionEmbeddings: r.int("max_position_embeddings", 131072, {}),
    attentionKEqV: r.bool("attention_k_eq_v", D.attentionKEqV),
    finalLogitSoftcapping: r.nullableNum("final_logit_softcapping", 30),
    useDoubleWideMlp: r.bool("use_double_wide_mlp", D.useDoubleWideMlp),
    enableMoeBlock: r.bool("enable_moe_block", false),
    numExperts: r.int("num_experts", null, { nullable: true }),
    topKExperts: r.int("top_k_experts", null, { nullable: true }),
    moeIntermediateSize: r.int("moe_intermediate_size", null, { nullable: true }),
    layerTypes: parseLayerTypes(r, numHiddenLayers, slidingWindowPattern),
    tieWordEmbeddings: r.bool("tie_word_embeddings", true),
  };

  // Cross-field checks: what would make mlx-lm fail later (or silently differ), named up front.
  if (cfg.hiddenSizePerLayerInput && cfg.vocabSizePerLayerInput === null) {
    r.fail("vocab_size_per_layer_input", "must be a positive integer when hidden_size_per_layer_input is set", null);
  }
  if (cfg.enableMoeBlock) {
    for (const k of ["num_experts", "top_k_experts", "moe_intermediate_size"]) {
      if (!r.given(k)) r.fail(k, "must be a positive integer when enable_moe_block is true", r.obj[k]);
    }
    if (cfg.topKExperts! > cfg.numExperts!) r.fail("top_k_experts", `must be at most num_experts (${cfg.numExperts})`, cfg.topKExperts);
  }
  if (cfg.numKvSharedLayers >= cfg.numHiddenLayers) {
    r.fail("num_kv_shared_layers", `must be less than num_hidden_layers (${cfg.numHiddenLayers})`, cfg.numKvSharedLayers);
  }
  const firstShared = cfg.numHiddenLayers - cfg.numKvSharedLayers;
  const owned = new Set(cfg.layerTypes.slice(0, firstShared));
  for (let j = firstShared; j < cfg.numHiddenLayers; j++) {
    if (!owned.has(cfg.layerTypes[j]!)) {
      r.fail(`layer_types[${j}]`, `is a KV-shared layer of a type no earlier layer (0..${firstShared - 1}) computes K/V for`, cfg.layerTypes[j]);
    }
  }
  for (const t of new Set(cfg.layerTypes)) {
    const kv = kvHeadsFor(cfg, t);
    if (cfg.numAttentionHeads % kv !== 0) {
      const key = kv === cfg.numGlobalKeyValueHeads && t === "full_attention" && cfg.attentionKEqV ? "num_global_key_value_heads" : "num_key_value_heads";
      r.fail(key, `must divide num_attention_heads (${cfg.numAttentionHeads})`, kv);
    }
  }
  for (const t of LAYER_TYPES) {
    const rp = cfg.ropeParameters[t];
    if (rp.ropeType === "proportional") {
      const dims = headDimFor(cfg, t);
      const rotated = Math.trunc(dims * rp.partialRotaryFactor);
      if (rotated % 2 !== 0) {
        r.fail(`rope_parameters.${t}.partial_rotary_factor`, `must rotate an even number of the ${dims} head dims`, rp.partialRotaryFactor);
      }
    }
  }
  // "vision" makes mlx-vlm attend bidirectionally within an image's tokens only; text prompts are causal there too.
  if (r.given("use_bidirectional_attention") && r.obj.use_bidirectional_attention !== "vision") {
    warnings.push(`${r.file}: ${r.path}use_bidirectional_attention=${fmt(r.obj.use_bidirectional_attention)} is ignored by mlx-lm (causal attention)`);
  }
  if (cfg.layerTypes[cfg.layerTypes.length - 1] !== "full_attention") {
    warnings.push(`${r.file}: ${r.path}layer_types: the last layer is not full_attention (transformers forces it; mlx-lm keeps it)`);
  }
  return { cfg, warnings };
}

function parseQuantParams(r: Reader, obj: Json, defaults: QuantParams | null): QuantParams {
  const modeRaw = r.has("mode") ? obj.mode : (defaults?.mode ?? "affine");
  if (typeof modeRaw !== "string" || !(modeRaw in QUANT_MODE_DEFAULTS)) {
    r.fail("mode", `must be one of ${Object.keys(QUANT_MODE_DEFAULTS).join(", ")}`, modeRaw);
  }
  const mode = modeRaw as QuantMode;
  const d = QUANT_MODE_DEFAULTS[mode];
  const groupSize = r.int("group_size", defaults?.groupSize ?? d.groupSize, {});
  const bits = r.int("bits", defaults?.bits ?? d.bits, {});
  const allowedBits = mode === "affine" ? [2, 3, 4, 5, 6, 8] : [d.bits];
  if (!allowedBits.includes(bits)) r.fail("bits", `must be one of ${allowedBits.join(", ")} for mode ${mode}`, bits);
  const allowedGroups = mode === "affine" ? [32, 64, 128] : [d.groupSize];
  if (!allowedGroups.includes(groupSize)) r.fail("group_size", `must be one of ${allowedGroups.join(", ")} for mode ${mode}`, groupSize);
  return { groupSize, bits, mode };
}

const QUANT_KEYS = new Set(["group_size", "bits", "mode"]);

/**
 * Parse an mlx "quantization" block: {"group_size", "bits", "mode"?, "<module path>": {...} | false}.
 * A per-module dict without "mode" is affine with that mode's defaults, as mlx's
 * `to_quantized(**params)` does (mlx/nn/layers/quantized.py _defaults_for_mode).
 */
export function parseQuantization(block: unknown, file = "config.json", path = "quantization"): QuantizationConfig {
  const top: Reader = new Reader(file, { [path]: block }, "");
  if (!isObject(block)) top.fail(path, "must be an object", block);
  const r: Reader = new Reader(file, block, `${path}.`);
  if (typeof block.quant_method === "string") {
    r.fail(
      "quant_method",
      'is a Hugging Face quantization format; only MLX-quantized checkpoints (a "quantization" block with group_size/bits) are supported',
      block.quant_method,
    );
  }
  if (!r.has("group_size") || !r.has("bits")) r.fail(r.has("bits") ? "group_size" : "bits", "is required", undefined);
  const def = parseQuantParams(r, block, null);
  const overrides = new Map<string, QuantParams | false>();
  for (const [k, v] of Object.entries(block)) {
    if (QUANT_KEYS.has(k)) continue;
    if (v === false) overrides.set(k, false);
    else if (v === true) overrides.set(k, { ...def });
    else if (isObject(v)) overrides.set(k, parseQuantParams(r.sub(k, v), v, null));
    else r.fail(k, "must be a per-module quantization object or false", v);
  }
  return { ...def, overrides };
}

/** Quantization params of one module path under a config (false: left unquantized by name). */
export function quantFor(q: QuantizationConfig, modulePath: string): QuantParams | false | undefined {
  return q.overrides.get(modulePath);
}

function eosList(r: Reader, key: string): number[] {
  if (!r.given(key)) return [];
  const v = r.obj[key];
  const list = Array.isArray(v) ? v : [v];
  list.forEach((x, i) => {
    if (typeof x !== "number" || !Number.isInteger(x) || x < 0)
      r.fail(Array.isArray(v) ? `${key}[${i}]` : key, "must be a token id (a non-negative integer) or a list of them", x);
  });
  return list as number[];
}

/**
 * Parse a config.json object. `file` names it in errors.
 * Wrapper form, as mlx-lm's gemma4.ModelArgs (gemma4.py:19-28): the text model's vocab_size is the
 * wrapper's top-level vocab_size (default 262144), whatever text_config.vocab_size says.
 */
export function parseGemma4Config(json: unknown, file = "config.json"): Gemma4Config {
  if (!isObject(json)) throw new ConfigError(`${file}: must be a JSON object, got ${fmt(json)}`);
  const r: Reader = new Reader(file, json, "");
  const mt = json.model_type;
  let text: Gemma4TextConfig;
  let warnings: string[];
  let form: Gemma4Config["form"];
  if (mt === "gemma4") {
    form = "wrapper";
    const tcRaw = json.text_config ?? {};
    if (!isObject(tcRaw)) r.fail("text_config", "must be an object", tcRaw);
    const vocab = r.int("vocab_size", 262144, {});
    ({ cfg: text, warnings } = parseTextConfig(r.sub("text_config", tcRaw), { vocab_size: vocab }));
    if (isObject(tcRaw) && typeof tcRaw.vocab_size === "number" && tcRaw.vocab_size !== vocab) {
      warnings.push(`${file}: text_config.vocab_size (${tcRaw.vocab_size}) differs from vocab_size (${vocab}); mlx-lm uses vocab_size`);
    }
  } else if (mt === "gemma4_unified") {
    // The 12B. mlx-lm has no model for it; mlx-vlm's gemma4_unified.Model is the reference: its text
    // model is gemma4's LanguageModel built from text_config (vocab_size included, the top-level one
    // is not read), with gemma4_unified's TextConfig defaults, and it always ties the output head.
    form = "wrapper";
    const tcRaw = json.text_config ?? {};
    if (!isObject(tcRaw)) r.fail("text_config", "must be an object", tcRaw);
    ({ cfg: text, warnings } = parseTextConfig(r.sub("text_config", tcRaw), {}, UNIFIED_TEXT_DEFAULTS));
    if (!text.tieWordEmbeddings) {
      warnings.push(
        `${file}: text_config.tie_word_embeddings is false, but mlx-vlm's gemma4_unified always ties the output head to embed_tokens (lm_head.weight is dropped); so does this loader`,
      );
      text.tieWordEmbeddings = true;
    }
  } else if (mt === "gemma4_text") {
    form = "text";
    ({ cfg: text, warnings } = parseTextConfig(r));
  } else {
    throw new ConfigError(
      `${file}: model_type ${fmt(mt)} is not a Gemma 4 model (expected "gemma4" for the multimodal wrapper, "gemma4_unified" for the 12B or "gemma4_text")`,
    );
  }

  // mlx-lm's load_model reads "quantization", else a "quantization_config" (top level, then text_config's).
  let quantization: QuantizationConfig | null = null;
  if (r.given("quantization")) quantization = parseQuantization(json.quantization, file, "quantization");
  else if (r.given("quantization_config")) quantization = parseQuantization(json.quantization_config, file, "quantization_config");
  else if (form === "wrapper" && isObject(json.text_config) && json.text_config.quantization_config != null) {
    quantization = parseQuantization(json.text_config.quantization_config, file, "text_config.quantization_config");
  }

  return {
    form,
    modelType: mt,
    text,
    prefix: form === "wrapper" ? "language_model." : "",
    eosTokenIds: eosList(r, "eos_token_id"),
    quantization,
    warnings,
    source: file,
    raw: json,
  };
}

/** Read and parse `dir/config.json`; generation_config.json's eos_token_id (when truthy) replaces config's, as mlx-lm's load_config. */
export function loadGemma4Config(dir: string): Gemma4Config {
  const file = join(dir, "config.json");
  const cfg = parseGemma4Config(readJson(file), file);
  const gen = join(dir, "generation_config.json");
  if (existsSync(gen)) {
    let g: unknown;
    try {
      g = JSON.parse(readFileSync(gen, "utf8"));
    } catch {
      g = {}; // mlx-lm ignores an unreadable generation_config.json (utils.py:373)
    }
    if (isObject(g) && g.eos_token_id) {
      cfg.eosTokenIds = eosList(new Reader(gen, g as Json, ""), "eos_token_id");
    }
  }
  return cfg;
}

export function readJson(file: string): unknown {
  assertRegularFile(file, (m) => new ConfigError(m));
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    throw new ConfigError(`${file}: ${code === "ENOENT" ? "file not found" : String(e)}`);
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new ConfigError(`${file}: not valid JSON (${(e as Error).message})`);
  }
}

// ---------------------------------------------------------------------------------------------
// Per-layer facts the forward pass needs (gemma4_text.py Attention/MLP/DecoderLayer __init__).
// ---------------------------------------------------------------------------------------------

export function headDimFor(c: Gemma4TextConfig, t: LayerType): number {
  return t === "full_attention" && c.globalHeadDim ? c.globalHeadDim : c.headDim; // :187-193
}

export function kvHeadsFor(c: Gemma4TextConfig, t: LayerType): number {
  const kEqV = c.attentionKEqV && t !== "sliding_attention"; // :199-203
  return kEqV && c.numGlobalKeyValueHeads !== null ? c.numGlobalKeyValueHeads : c.numKeyValueHeads;
}

/** How one layer applies RoPE: mx.fast.rope(x, dims, traditional, base/freqs, scale, offset). */
export interface LayerRope {
  type: RopeType;
  /** mx.fast.rope's `dims`: the head dim (all of it; proportional RoPE rotates part via inf freqs). */
  dims: number;
  theta: number;
  traditional: boolean;
  /** default/linear: mx.fast.rope scale (1, or 1/factor for linear). */
  scale: number;
  /** proportional only: rotated dims = int(dims * partial_rotary_factor). */
  rotatedDims: number;
  /** proportional only: freqs multiplier. */
  factor: number;
}

export interface LayerSpec {
  index: number;
  type: LayerType;
  headDim: number;
  numHeads: number;
  numKvHeads: number;
  /** Keys double as values (no v_proj): attention_k_eq_v on a non-sliding layer. */
  kEqV: boolean;
  /** Computes its own K/V (index < num_hidden_layers - num_kv_shared_layers). */
  hasKv: boolean;
  /** Layer whose K/V (after its cache update) this layer attends over: itself, or the last owning layer of its type. */
  kvSource: number;
  /** Sliding window of the attention mask, or null for full attention. */
  window: number | null;
  mlpIntermediateSize: number;
  rope: LayerRope;
}

/** Per-layer specs, in order. */
export function layerSpecs(c: Gemma4TextConfig): LayerSpec[] {
  const n = c.numHiddenLayers;
  const firstShared = n - c.numKvSharedLayers;
  const lastOwner = new Map<LayerType, number>();
  for (let i = 0; i < firstShared; i++) lastOwner.set(c.layerTypes[i]!, i); // :436-444
  return c.layerTypes.map((type, i) => {
    const sliding = type === "sliding_attention";
    const headDim = headDimFor(c, type);
    const rp = c.ropeParameters[sliding ? "sliding_attention" : "full_attention"];
    const isShared = i >= firstShared && firstShared > 0; // MLP :102-107
    return {
      index: i,
      type,
      headDim,
      numHeads: c.numAttentionHeads,
      numKvHeads: kvHeadsFor(c, type),
      kEqV: c.attentionKEqV && !sliding,
      hasKv: i < firstShared,
      kvSource: i < firstShared ? i : lastOwner.get(type)!,
      window: sliding ? c.slidingWindow : null,
      mlpIntermediateSize: c.intermediateSize * (c.useDoubleWideMlp && isShared ? 2 : 1),
      rope: {
        type: rp.ropeType,
        dims: headDim,
        theta: rp.ropeTheta,
        traditional: c.ropeTraditional,
        scale: rp.ropeType === "linear" ? 1 / rp.factor : 1,
        rotatedDims: rp.ropeType === "proportional" ? Math.trunc(headDim * rp.partialRotaryFactor) : headDim,
        factor: rp.ropeType === "proportional" ? rp.factor : 1,
      },
    };
  });
}

// ---------------------------------------------------------------------------------------------
// Gemma 4 MTP drafters ("assistant" models): mlx-vlm's Gemma4AssistantConfig
// (speculative/drafters/gemma4_assistant/config.py), the layout HF ships and mlx-vlm reads.
// ---------------------------------------------------------------------------------------------

/** A parsed gemma4_assistant config.json (top level plus its text_config). */
export interface Gemma4AssistantConfig {
  modelType: "gemma4_assistant";
  /** The drafter's own layers (every one attends over the target's K/V; no K/V projections). */
  text: Gemma4TextConfig;
  /** backbone_hidden_size = 1536: the target's hidden size (the drafter reads its hidden state). */
  backboneHiddenSize: number;
  /** use_ordered_embeddings = false: the centroid-routed sparse LM head (E2B/E4B drafters). */
  useOrderedEmbeddings: boolean;
  /** num_centroids = 2048 */
  numCentroids: number;
  /** centroid_intermediate_top_k = 32 */
  centroidTopK: number;
  /** tie_word_embeddings = true (top level; text_config's is not read, as mlx-vlm). */
  tieWordEmbeddings: boolean;
  /** block_size = 4: drafted tokens + 1 per round; the default number of draft tokens is block_size - 1. */
  blockSize: number;
  quantization: QuantizationConfig | null;
  source: string;
  raw: Record<string, unknown>;
}

/** Whether a parsed config.json is a Gemma 4 MTP drafter (model_type "gemma4_assistant"). */
export function isGemma4AssistantConfig(json: unknown): boolean {
  return isObject(json) && json.model_type === "gemma4_assistant";
}

/**
 * Parse a gemma4_assistant config.json. text_config is read like a Gemma 4 text config; its
 * num_kv_shared_layers is not used (every drafter layer reads the target's K/V: mlx-vlm sets it to
 * num_hidden_layers), so no layer gets the double-wide MLP of KV-shared layers.
 */
export function parseGemma4AssistantConfig(json: unknown, file = "config.json"): Gemma4AssistantConfig {
  if (!isObject(json)) throw new ConfigError(`${file}: must be a JSON object, got ${fmt(json)}`);
  const r: Reader = new Reader(file, json, "");
  if (json.model_type !== "gemma4_assistant") r.fail("model_type", 'must be "gemma4_assistant" for a Gemma 4 MTP drafter', json.model_type);
  const tcRaw = json.text_config;
  if (!isObject(tcRaw)) r.fail("text_config", "must be an object (the drafter's layers)", tcRaw);
  const { cfg: text } = parseTextConfig(r.sub("text_config", { ...tcRaw, num_kv_shared_layers: 0 }));
  const useOrderedEmbeddings = r.bool("use_ordered_embeddings", false);
  const numCentroids = r.int("num_centroids", 2048, {});
  const centroidTopK = r.int("centroid_intermediate_top_k", 32, {});
  if (useOrderedEmbeddings) {
    if (text.vocabSize % numCentroids !== 0) r.fail("num_centroids", `must divide text_config.vocab_size (${text.vocabSize})`, numCentroids);
    if (centroidTopK > numCentroids) r.fail("centroid_intermediate_top_k", `must be at most num_centroids (${numCentroids})`, centroidTopK);
  }
  let quantization: QuantizationConfig | null = null;
  if (r.given("quantization")) quantization = parseQuantization(json.quantization, file, "quantization");
  else if (r.given("quantization_config")) quantization = parseQuantization(json.quantization_config, file, "quantization_config");
  return {
    modelType: "gemma4_assistant",
    text,
    backboneHiddenSize: r.int("backbone_hidden_size", 1536, {}),
    useOrderedEmbeddings,
    numCentroids,
    centroidTopK,
    tieWordEmbeddings: r.bool("tie_word_embeddings", true),
    blockSize: r.int("block_size", 4, { min: 2 }),
    quantization,
    source: file,
    raw: json,
  };
}
