// Weights of a Gemma 4 checkpoint: find the safetensors files (single or sharded by
// model.safetensors.index.json), map checkpoint names to mlx-lm's module names exactly as
// mlx-lm's sanitize does (gemma4.py:54-81, gemma4_text.py:612-654; for gemma4_unified, which
// mlx-lm lacks, as mlx-vlm's gemma4_unified.Model.sanitize + LanguageModel.sanitize do), and list
// the tensors a config needs (name, shape, dtype) so a loader reports missing / unexpected /
// mis-shaped tensors by name. Vision and audio tensors are dropped by name: only the text side loads.
import { existsSync, readdirSync } from "node:fs";
import { basename, join } from "node:path";
import { type Dtype, isFloating, loadSafetensors, type MlxArray, readSafetensorsHeader, type SafetensorsHeader, type TensorInfo } from "@mlx-bun/mlx-ffi";
import { contiguous, split as splitArray } from "@mlx-bun/mlx-ops";
import { type Gemma4Config, layerSpecs, type QuantizationConfig, type QuantMode, type QuantParams, readJson } from "./config.ts";
import { WeightsError } from "./errors.ts";
import { assertRegularFile } from "./files.ts";

// ---------------------------------------------------------------------------------------------
// Finding and opening the files
// ---------------------------------------------------------------------------------------------

export const INDEX_FILE = "model.safetensors.index.json";

/** Where one tensor lives. */
export interface TensorLocation {
  file: string;
  info: TensorInfo;
}

/** The checkpoint's weight files and every tensor in them (headers only; no data read). */
export interface WeightFiles {
  dir: string;
  files: string[];
  /** Parsed index (sharded checkpoints), or null. */
  index: { path: string; weightMap: Map<string, string>; metadata: Record<string, unknown> } | null;
  tensors: Map<string, TensorLocation>;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function header(file: string): SafetensorsHeader {
  assertRegularFile(file, (m) => new WeightsError(m));
  try {
    return readSafetensorsHeader(file);
  } catch (e) {
    throw new WeightsError((e as Error).message);
  }
}

/**
 * Find a checkpoint's weights: model.safetensors.index.json (its weight_map is authoritative:
 * every entry must name an existing shard that holds that tensor), else model.safetensors, else
 * any model*.safetensors (mlx-lm globs these; a tensor name in two files is an error).
 */
export function findWeights(dir: string): WeightFiles {
  const indexPath = join(dir, INDEX_FILE);
  if (existsSync(indexPath)) {
    let json: unknown;
    try {
      json = readJson(indexPath);
    } catch (e) {
      throw new WeightsError((e as Error).message);
    }
    if (!isObject(json)) throw new WeightsError(`${indexPath}: must be a JSON object`);
    const wm = json.weight_map;
    if (!isObject(wm)) throw new WeightsError(`${indexPath}: weight_map must be an object of tensor name -> shard file, got ${JSON.stringify(wm)}`);
    const weightMap = new Map<string, string>();
    for (const [name, f] of Object.entries(wm)) {
      if (typeof f !== "string" || f === "" || f.includes("/") || f.includes("\\")) {
        throw new WeightsError(`${indexPath}: weight_map["${name}"] must be a shard file name in the same folder, got ${JSON.stringify(f)}`);
      }
      weightMap.set(name, f);
    }
    if (weightMap.size === 0) throw new WeightsError(`${indexPath}: weight_map is empty`);
    const shards = [...new Set(weightMap.values())].sort();
    const headers = new Map<string, SafetensorsHeader>();
    for (const s of shards) {
      const p = join(dir, s);
      if (!existsSync(p)) {
        const example = [...weightMap].find(([, f]) => f === s)![0];
        throw new WeightsError(`${indexPath}: shard ${s} (holding e.g. '${example}') is missing from ${dir}`);
      }
      headers.set(s, header(p));
    }
    const tensors = new Map<string, TensorLocation>();
    for (const [name, s] of weightMap) {
      const info = headers.get(s)!.tensors.get(name);
      if (!info) throw new WeightsError(`${indexPath}: weight_map says '${name}' is in ${s}, but ${join(dir, s)} has no tensor of that name`);
      tensors.set(name, { file: join(dir, s), info });
    }
    const metadata = isObject(json.metadata) ? json.metadata : {};
    return { dir, files: shards.map((s) => join(dir, s)), index: { path: indexPath, weightMap, metadata }, tensors };
  }
  const single = join(dir, "model.safetensors");
  let files: string[];
  if (existsSync(single)) files = [single];
  else {
    let entries: string[];
    try {
      entries = readdirSync(dir);
    } catch (e) {
      throw new WeightsError(`${dir}: ${(e as NodeJS.ErrnoException).code === "ENOENT" ? "folder not found" : String(e)}`);
    }
    files = entries
      .filter((f) => f.startsWith("model") && f.endsWith(".safetensors"))
      .sort()
      .map((f) => join(dir, f));
    if (files.length === 0) throw new WeightsError(`${dir}: no model.safetensors, ${INDEX_FILE} or model*.safetensors`);
  }
  const tensors = new Map<string, TensorLocation>();
  for (const f of files) {
    for (const [name, info] of header(f).tensors) {
      const prev = tensors.get(name);
      if (prev) throw new WeightsError(`tensor '${name}' is in both ${basename(prev.file)} and ${basename(f)} (no ${INDEX_FILE} to choose)`);
      tensors.set(name, { file: f, info });
    }
  }
  return { dir, files, index: null, tensors };
}

// ---------------------------------------------------------------------------------------------
// Sanitize: checkpoint names -> mlx-lm module names
// ---------------------------------------------------------------------------------------------

/** Where a sanitized tensor comes from: a checkpoint tensor, whole or one half along axis -2. */
export interface TensorSource {
  source: string;
  /** experts.gate_up_proj is split in two along axis -2: index 0 = gate, 1 = up (gemma4_text.py:640-645). */
  split?: { axis: -2; parts: 2; index: 0 | 1 };
}

export interface SanitizePlan {
  tensors: Map<string, TensorSource>;
  dropped: { name: string; reason: string }[];
}

const MULTIMODAL_PREFIXES = ["vision_tower", "multi_modal_projector", "audio_tower", "embed_audio", "embed_vision", "vision_embedder"];
/** Reason given for a dropped vision/audio tensor (load.ts counts these for its "text only" note). */
export const MULTIMODAL_DROP_REASON = "multimodal tower (not part of the text model)";
const TEXT_DROP = ["self_attn.rotary_emb", "input_max", "input_min", "output_max", "output_min"];
const KV_PROJ = [".self_attn.k_proj", ".self_attn.v_proj", ".self_attn.k_norm"];

/** Python's int(s) on a layer index segment: optional sign and digits (with surrounding whitespace). */
function pyInt(s: string): number | null {
  const t = s.trim();
  return /^[+-]?\d+$/.test(t) ? Number.parseInt(t, 10) : null;
}

/**
 * The renames and drops of mlx-lm's sanitize, on names only. Later entries win on a name
 * collision, as the Python dicts do. Iteration order of `names` is kept.
 */
export function planSanitize(names: Iterable<string>, config: Gemma4Config): SanitizePlan {
  const dropped: SanitizePlan["dropped"] = [];
  // Stage 1: gemma4.Model.sanitize (wrapper only).
  let stage: [string, string][] = []; // [newName, source]
  const unified = config.modelType === "gemma4_unified";
  for (const name of names) {
    if (config.form !== "wrapper") {
      stage.push([name, name]);
      continue;
    }
    if (unified && name === "lm_head.weight") {
      // gemma4_unified.py sanitize: the head is always tied to embed_tokens.
      dropped.push({ name, reason: "output head (gemma4_unified ties it to embed_tokens)" });
      continue;
    }
    const startsWithModel = name.startsWith("model.");
    let k = startsWithModel ? name.slice("model.".length) : name;
    if (MULTIMODAL_PREFIXES.some((p) => k.startsWith(p))) {
      dropped.push({ name, reason: MULTIMODAL_DROP_REASON });
      continue;
    }
    if (unified) {
      // mlx-vlm: "language_model.X" -> "language_model.model.X" unless it already is, with or without "model.".
      if (k.startsWith("language_model.") && !k.startsWith("language_model.model.")) k = `language_model.model.${k.slice("language_model.".length)}`;
    } else if (startsWithModel && k.startsWith("language_model")) k = k.replaceAll("language_model.", "language_model.model.");
    stage.push([k, name]);
  }
  // Dict semantics: a later key overwrites an earlier one but keeps the earlier position.
  const dedup = new Map<string, string>();
  for (const [k, src] of stage) dedup.set(k, src);
  stage = [...dedup];

  // Stage 2: gemma4_text.Model.sanitize.
  const t = config.text;
  const firstShared = t.numHiddenLayers - t.numKvSharedLayers;
  const tensors = new Map<string, TensorSource>();
  for (const [k, src] of stage) {
    if (TEXT_DROP.some((s) => k.includes(s))) {
      dropped.push({ name: src, reason: "rotary buffer / clipping bound (unused by mlx-lm)" });
      continue;
    }
    if (KV_PROJ.some((s) => k.includes(s))) {
      const i = k.indexOf("layers.");
      if (i >= 0) {
        const rest = k.slice(i + "layers.".length);
        const idx = pyInt(rest.split(".")[0]!);
        if (idx !== null && idx >= firstShared) {
          dropped.push({ name: src, reason: `K/V projection of KV-shared layer ${idx} (reuses an earlier layer's K/V)` });
          continue;
        }
      }
    }
    if (k.endsWith(".experts.gate_up_proj")) {
      const base = k.slice(0, -".gate_up_proj".length);
      tensors.set(`${base}.switch_glu.gate_proj.weight`, { source: src, split: { axis: -2, parts: 2, index: 0 } });
      tensors.set(`${base}.switch_glu.up_proj.weight`, { source: src, split: { axis: -2, parts: 2, index: 1 } });
      continue;
    }
    if (k.endsWith(".experts.down_proj")) {
      tensors.set(`${k.slice(0, -".down_proj".length)}.switch_glu.down_proj.weight`, { source: src });
      continue;
    }
    tensors.set(k, { source: src });
  }
  return { tensors, dropped };
}

/** Shape and dtype of every sanitized tensor, from the checkpoint headers. */
export function sanitizedInfo(plan: SanitizePlan, infos: Map<string, { shape: number[]; dtype: Dtype }>): Map<string, { shape: number[]; dtype: Dtype }> {
  const out = new Map<string, { shape: number[]; dtype: Dtype }>();
  for (const [name, src] of plan.tensors) {
    const info = infos.get(src.source);
    if (!info) throw new WeightsError(`sanitize: no checkpoint tensor '${src.source}' (for '${name}')`);
    let shape = [...info.shape];
    if (src.split) {
      const ax = shape.length + src.split.axis;
      if (ax < 0 || shape[ax]! % src.split.parts !== 0) {
        throw new WeightsError(`'${src.source}' has shape [${info.shape}]: axis ${src.split.axis} does not split in ${src.split.parts}`);
      }
      shape[ax] = shape[ax]! / src.split.parts;
    }
    out.set(name, { shape, dtype: info.dtype });
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Expected-tensor manifest
// ---------------------------------------------------------------------------------------------

export type ModuleKind = "linear" | "embedding" | "switch_linear" | "param";

export interface ExpectedTensor {
  name: string;
  shape: number[];
  dtype: Dtype;
  /** The module it belongs to ("…q_proj"), and what kind of module that is. */
  module: string;
  kind: ModuleKind;
  /** Set on the weight/scales/biases of a quantized module. */
  quant?: QuantParams;
}

export interface ManifestOptions {
  /** Floating dtype of the checkpoint's unquantized tensors and affine scales/biases (default bfloat16). */
  dtype?: Dtype;
  /** Quantization to assume (default: config.quantization). */
  quantization?: QuantizationConfig | null;
  /**
   * The checkpoint's (sanitized) tensors. With it, a module the quantization block does not name
   * is quantized exactly when "<module>.scales" is present, with group size and bits read off the
   * shapes (mlx-lm's load_model + infer_quant_config). Without it, as mlx-lm's quantize_model
   * writes checkpoints: every Linear/Embedding/SwitchLinear whose input dim divides by the
   * default group size.
   */
  actual?: Map<string, { shape: number[]; dtype: Dtype }>;
}

interface ModuleDecl {
  path: string;
  kind: ModuleKind;
  /** Weight shape as the unquantized module holds it ([..., out, in]) or the param's shape. */
  shape: number[];
}

/** Every parameter of mlx-lm's Gemma 4 model for this config, in module order. */
export function modelModules(config: Gemma4Config): ModuleDecl[] {
  const t = config.text;
  const P = config.prefix;
  const M = `${P}model.`;
  const H = t.hiddenSize;
  const out: ModuleDecl[] = [];
  const lin = (path: string, outDim: number, inDim: number) => out.push({ path, kind: "linear", shape: [outDim, inDim] });
  const param = (path: string, shape: number[]) => out.push({ path, kind: "param", shape });

  out.push({ path: `${M}embed_tokens`, kind: "embedding", shape: [t.vocabSize, H] });
  const ple = t.hiddenSizePerLayerInput;
  for (const s of layerSpecs(t)) {
    const L = `${M}layers.${s.index}.`;
    lin(`${L}self_attn.q_proj`, s.numHeads * s.headDim, H);
    if (s.hasKv) {
      lin(`${L}self_attn.k_proj`, s.numKvHeads * s.headDim, H);
      if (!s.kEqV) lin(`${L}self_attn.v_proj`, s.numKvHeads * s.headDim, H);
    }
    lin(`${L}self_attn.o_proj`, H, s.numHeads * s.headDim);
    param(`${L}self_attn.q_norm.weight`, [s.headDim]);
    if (s.hasKv) param(`${L}self_attn.k_norm.weight`, [s.headDim]);
    lin(`${L}mlp.gate_proj`, s.mlpIntermediateSize, H);
    lin(`${L}mlp.down_proj`, H, s.mlpIntermediateSize);
    lin(`${L}mlp.up_proj`, s.mlpIntermediateSize, H);
    for (const n of ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"]) {
      param(`${L}${n}.weight`, [H]);
    }
    if (t.enableMoeBlock) {
      const E = t.numExperts!;
      const I = t.moeIntermediateSize!;
      lin(`${L}router.proj`, E, H);
      param(`${L}router.scale`, [H]);
      param(`${L}router.per_expert_scale`, [E]);
      out.push({ path: `${L}experts.switch_glu.gate_proj`, kind: "switch_linear", shape: [E, I, H] });
      out.push({ path: `${L}experts.switch_glu.up_proj`, kind: "switch_linear", shape: [E, I, H] });
      out.push({ path: `${L}experts.switch_glu.down_proj`, kind: "switch_linear", shape: [E, H, I] });
      for (const n of ["post_feedforward_layernorm_1", "post_feedforward_layernorm_2", "pre_feedforward_layernorm_2"]) {
        param(`${L}${n}.weight`, [H]);
      }
    }
    if (ple) {
      lin(`${L}per_layer_input_gate`, ple, H);
      lin(`${L}per_layer_projection`, H, ple);
      param(`${L}post_per_layer_input_norm.weight`, [H]);
    }
    param(`${L}layer_scalar`, [1]);
  }
  param(`${M}norm.weight`, [H]);
  if (ple) {
    out.push({ path: `${M}embed_tokens_per_layer`, kind: "embedding", shape: [t.vocabSizePerLayerInput!, t.numHiddenLayers * ple] });
    lin(`${M}per_layer_model_projection`, t.numHiddenLayers * ple, H);
    param(`${M}per_layer_projection_norm.weight`, [ple]);
  }
  if (!t.tieWordEmbeddings) lin(`${P}lm_head`, t.vocabSize, H);
  return out;
}

function inferQuant(path: string, inDim: number, actual: Map<string, { shape: number[]; dtype: Dtype }>): QuantParams {
  const scales = actual.get(`${path}.scales`)!;
  const w = actual.get(`${path}.weight`);
  const groupSize = Math.trunc(inDim / scales.shape[scales.shape.length - 1]!);
  const bits = w ? Math.trunc((w.shape[w.shape.length - 1]! * 32) / inDim) : 0;
  let mode: QuantMode = "affine";
  if (scales.dtype === "uint8") {
    if (bits === 4 && groupSize === 16) mode = "nvfp4";
    else if (bits === 4 && groupSize === 32) mode = "mxfp4";
    else if (bits === 8 && groupSize === 32) mode = "mxfp8";
    else throw new WeightsError(`cannot infer the quantization mode of ${path}: ${bits} bits with group size ${groupSize}`);
  }
  return { groupSize, bits, mode };
}

/** The tensors mlx-lm's model needs for this config (sanitized names), with shapes and dtypes. */
export function expectedTensors(config: Gemma4Config, opts: ManifestOptions = {}): Map<string, ExpectedTensor> {
  const dtype = opts.dtype ?? "bfloat16";
  const q = opts.quantization === undefined ? config.quantization : opts.quantization;
  const out = new Map<string, ExpectedTensor>();
  for (const m of modelModules(config)) {
    if (m.kind === "param") {
      out.set(m.path, { name: m.path, shape: m.shape, dtype, module: m.path.replace(/\.[^.]+$/, ""), kind: m.kind });
      continue;
    }
    const inDim = m.shape[m.shape.length - 1]!;
    let qp: QuantParams | false = false;
    if (q) {
      const o = q.overrides.get(m.path);
      if (o !== undefined) qp = o;
      else if (opts.actual) qp = opts.actual.has(`${m.path}.scales`) ? inferQuant(m.path, inDim, opts.actual) : false;
      else qp = inDim % q.groupSize === 0 ? { groupSize: q.groupSize, bits: q.bits, mode: q.mode } : false;
    }
    if (!qp) {
      out.set(`${m.path}.weight`, { name: `${m.path}.weight`, shape: m.shape, dtype, module: m.path, kind: m.kind });
      continue;
    }
    const lead = m.shape.slice(0, -1);
    const packed = (inDim * qp.bits) / 32;
    const groups = inDim / qp.groupSize;
    const scaleDtype: Dtype = qp.mode === "affine" ? dtype : "uint8";
    const add = (suffix: string, shape: number[], dt: Dtype) =>
      out.set(`${m.path}.${suffix}`, { name: `${m.path}.${suffix}`, shape, dtype: dt, module: m.path, kind: m.kind, quant: qp as QuantParams });
    add("weight", [...lead, packed], "uint32");
    add("scales", [...lead, groups], scaleDtype);
    if (qp.mode === "affine") add("biases", [...lead, groups], dtype);
  }
  return out;
}

/** Differences between a manifest and a checkpoint's (sanitized) tensors. */
export interface TensorCheck {
  missing: string[];
  unexpected: string[];
  mismatched: { name: string; expected: string; actual: string }[];
  ok: boolean;
}

/**
 * Compare (sanitized) checkpoint tensors with a manifest. Floating tensors match any floating
 * dtype unless `strictDtype`; packed (uint32) and uint8 scales must match exactly.
 */
export function checkTensors(
  expected: Map<string, ExpectedTensor>,
  actual: Map<string, { shape: number[]; dtype: Dtype }>,
  opts: { strictDtype?: boolean } = {},
): TensorCheck {
  const missing: string[] = [];
  const mismatched: TensorCheck["mismatched"] = [];
  for (const [name, e] of expected) {
    const a = actual.get(name);
    if (!a) {
      missing.push(name);
      continue;
    }
    const shapeOk = a.shape.length === e.shape.length && a.shape.every((d, i) => d === e.shape[i]);
    const dtypeOk = a.dtype === e.dtype || (!opts.strictDtype && isFloating(e.dtype) && isFloating(a.dtype));
    if (!shapeOk || !dtypeOk) mismatched.push({ name, expected: `${e.dtype}[${e.shape}]`, actual: `${a.dtype}[${a.shape}]` });
  }
  const unexpected = [...actual.keys()].filter((n) => !expected.has(n));
  return { missing, unexpected, mismatched, ok: !missing.length && !unexpected.length && !mismatched.length };
}

function listSome(xs: string[], n = 8): string {
  return xs.length <= n ? xs.join(", ") : `${xs.slice(0, n).join(", ")} and ${xs.length - n} more`;
}

/** Throw a WeightsError naming every missing, unexpected and mis-shaped tensor. */
export function assertTensors(check: TensorCheck, where: string): void {
  if (check.ok) return;
  const parts: string[] = [];
  if (check.missing.length) parts.push(`missing ${check.missing.length}: ${listSome(check.missing)}`);
  if (check.unexpected.length) parts.push(`unexpected ${check.unexpected.length}: ${listSome(check.unexpected)}`);
  if (check.mismatched.length) {
    parts.push(
      `mis-shaped ${check.mismatched.length}: ${listSome(
        check.mismatched.map((m) => `${m.name} (expected ${m.expected}, got ${m.actual})`),
        4,
      )}`,
    );
  }
  throw new WeightsError(`${where}: weights do not match the config: ${parts.join("; ")}`);
}

// ---------------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------------

export interface LoadedWeights extends Disposable {
  /** Sanitized name → lazily loaded array (data is read on eval). */
  tensors: Map<string, MlxArray>;
  plan: SanitizePlan;
  files: WeightFiles;
  dispose(): void;
}

export interface LoadWeightsOptions {
  /**
   * Splits one array into `parts` equal arrays along `axis` (contiguous copies), for the fused
   * experts.gate_up_proj of Hugging Face MoE checkpoints. Default: mlx-ops'
   * `split` + `contiguous`, as mlx-lm's `map(mx.contiguous, mx.split(v, 2, axis=-2))`.
   */
  split?: (a: MlxArray, parts: number, axis: number) => MlxArray[];
  /** Skip the manifest check (default: check, and throw on any difference). */
  skipCheck?: boolean;
}

/** Tensor infos of a checkpoint after sanitize (headers only). */
export function checkpointTensorInfo(files: WeightFiles, config: Gemma4Config): { plan: SanitizePlan; info: Map<string, { shape: number[]; dtype: Dtype }> } {
  const plan = planSanitize(files.tensors.keys(), config);
  const raw = new Map<string, { shape: number[]; dtype: Dtype }>();
  for (const [n, l] of files.tensors) raw.set(n, { shape: l.info.shape, dtype: l.info.dtype });
  return { plan, info: sanitizedInfo(plan, raw) };
}

function defaultSplit(a: MlxArray, parts: number, axis: number): MlxArray[] {
  const views = splitArray(a, parts, axis);
  try {
    return views.map((v) => contiguous(v));
  } finally {
    for (const v of views) v.dispose();
  }
}

/**
 * The tensors of a checkpoint's files that `pick` keeps, under the names it gives (`null`: not
 * wanted); a tensor is taken from the file the index assigns it to. The caller owns them.
 */
export function loadPickedTensors(files: WeightFiles, pick: (name: string) => string | null): Map<string, MlxArray> {
  const out = new Map<string, MlxArray>();
  try {
    for (const f of files.files) {
      const l = loadSafetensors(f);
      for (const [n, a] of l.tensors) {
        const k = files.tensors.get(n)?.file === f ? pick(n) : null;
        if (k !== null) out.set(k, a);
        else a.dispose();
      }
    }
  } catch (e) {
    for (const a of out.values()) a.dispose();
    throw e;
  }
  return out;
}

/** Open a checkpoint's weights lazily, sanitized and checked against the config's manifest. */
export function loadWeights(dir: string, config: Gemma4Config, opts: LoadWeightsOptions = {}): LoadedWeights {
  const files = findWeights(dir);
  const { plan, info } = checkpointTensorInfo(files, config);
  if (!opts.skipCheck) assertTensors(checkTensors(expectedTensors(config, { actual: info }), info), dir);
  const split = opts.split ?? defaultSplit;
  const used = new Set([...plan.tensors.values()].map((s) => s.source));
  const raw = loadPickedTensors(files, (n) => (used.has(n) ? n : null));
  const owned: MlxArray[] = [];
  try {
    const tensors = new Map<string, MlxArray>();
    const splits = new Map<string, MlxArray[]>();
    for (const [name, src] of plan.tensors) {
      const a = raw.get(src.source)!;
      if (!src.split) {
        tensors.set(name, a);
        continue;
      }
      let parts = splits.get(src.source);
      if (!parts) {
        parts = split(a, src.split.parts, src.split.axis);
        splits.set(src.source, parts);
        owned.push(...parts);
      }
      tensors.set(name, parts[src.split.index]!);
    }
    for (const [n, a] of raw) if (splits.has(n)) a.dispose();
    const dispose = () => {
      for (const a of new Set(tensors.values())) a.dispose();
    };
    return { tensors, plan, files, dispose, [Symbol.dispose]: dispose };
  } catch (e) {
    for (const a of raw.values()) a.dispose();
    for (const a of owned) a.dispose();
    throw e;
  }
}
