// The Gemma 4 vision tower and multimodal embedder (E2B/E4B/26B/31B), as mlx-vlm 0.7.10 computes
// them (mlx_vlm/models/gemma4/vision.py VisionModel, gemma4.py MultimodalEmbedder): patchify,
// input projection + 2-D position embeddings, a bidirectional transformer with 2-D RoPE, average
// pooling of pooling x pooling patches, optional standardize, then RMSNorm (no scale) and the
// projection into the text model's hidden size. Same ops, order and dtypes (docs/images.md).
import { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import type { Gemma4Config, QuantParams } from "../config.ts";
import { ConfigError, WeightsError } from "../errors.ts";
import { linear, type ModuleWeights } from "../model/nn.ts";
import { Scope } from "../model/scope.ts";
import { findWeights, loadPickedTensors } from "../weights.ts";
import { EncoderWeights, embedVision, type MultimodalTokens } from "./encoder.ts";
import type { PreprocessedImage } from "./preprocess.ts";

/** vision_config (mlx-vlm gemma4/config.py VisionConfig; defaults from there). */
export interface VisionConfig {
  hiddenSize: number;
  intermediateSize: number;
  numHiddenLayers: number;
  numAttentionHeads: number;
  numKeyValueHeads: number;
  headDim: number;
  rmsNormEps: number;
  ropeTheta: number;
  defaultOutputLength: number;
  patchSize: number;
  positionEmbeddingSize: number;
  poolingKernelSize: number;
  useClippedLinears: boolean;
  standardize: boolean;
}

function obj(v: unknown): Record<string, unknown> | null {
  return typeof v === "object" && v !== null && !Array.isArray(v) ? (v as Record<string, unknown>) : null;
}

/** The vision_config of a parsed config, or null when the checkpoint has none (text-only). */
export function parseVisionConfig(config: Gemma4Config): VisionConfig | null {
  const vc = obj(config.raw.vision_config);
  if (!vc || config.modelType !== "gemma4") return null;
  const int = (k: string, d: number): number => {
    const v = vc[k] ?? d;
    if (typeof v !== "number" || !Number.isInteger(v) || v <= 0)
      throw new ConfigError(`config.json: vision_config.${k} must be a positive integer, got ${JSON.stringify(v)}`);
    return v;
  };
  const rope = obj(vc.rope_parameters);
  const theta = rope?.rope_theta ?? 100.0;
  if (typeof theta !== "number") throw new ConfigError(`config.json: vision_config.rope_parameters.rope_theta must be a number`);
  const eps = vc.rms_norm_eps ?? 1e-6;
  if (typeof eps !== "number" || !(eps > 0)) throw new ConfigError(`config.json: vision_config.rms_norm_eps must be a positive number`);
  const c: VisionConfig = {
    hiddenSize: int("hidden_size", 768),
    intermediateSize: int("intermediate_size", 3072),
    numHiddenLayers: int("num_hidden_layers", 16),
    numAttentionHeads: int("num_attention_heads", 12),
    numKeyValueHeads: int("num_key_value_heads", 12),
    headDim: int("head_dim", 64),
    rmsNormEps: eps,
    ropeTheta: theta,
    defaultOutputLength: int("default_output_length", 280),
    patchSize: int("patch_size", 16),
    positionEmbeddingSize: int("position_embedding_size", 10240),
    poolingKernelSize: int("pooling_kernel_size", 3),
    useClippedLinears: vc.use_clipped_linears === true,
    standardize: vc.standardize === true,
  };
  if (c.headDim % 4 !== 0) throw new ConfigError(`config.json: vision_config.head_dim (${c.headDim}) must be a multiple of 4 (2-D RoPE)`);
  return c;
}

export function parseMultimodalTokens(config: Gemma4Config): MultimodalTokens {
  const r = config.raw;
  const id = (k: string, d: number | null): number | null => (typeof r[k] === "number" ? (r[k] as number) : r[k] === null ? null : d);
  return {
    imageTokenId: id("image_token_id", 258880)!,
    boiTokenId: id("boi_token_id", 255999)!,
    eoiTokenId: id("eoi_token_id", 258882)!,
    audioTokenId: id("audio_token_id", 258881),
    videoTokenId: id("video_token_id", null),
  };
}

interface ClipLinear extends ModuleWeights {
  clip?: { inMin: MlxArray; inMax: MlxArray; outMin: MlxArray; outMax: MlxArray };
}

interface VisionLayer {
  q: ClipLinear;
  k: ClipLinear;
  v: ClipLinear;
  o: ClipLinear;
  qNorm: MlxArray;
  kNorm: MlxArray;
  inputNorm: MlxArray;
  postAttnNorm: MlxArray;
  preFfNorm: MlxArray;
  postFfNorm: MlxArray;
  gate: ClipLinear;
  up: ClipLinear;
  down: ClipLinear;
}

let geluFn: mx.CompiledFunction<[MlxArray], MlxArray> | undefined;
/** mlx.nn.gelu_approx (compiled, shapeless, as mlx.nn declares it). */
function geluApprox(x: MlxArray): MlxArray {
  geluFn ??= mx.compile((a: MlxArray) => mx.gelu_approx(a), { shapeless: true });
  return geluFn(x);
}

/** The vision tower + embed_vision of one checkpoint; owns its weights. */
export class Gemma4Vision extends EncoderWeights {
  readonly layers: VisionLayer[];
  readonly textHidden: number;

  private constructor(
    readonly config: VisionConfig,
    readonly tokens: MultimodalTokens,
    tensors: Map<string, MlxArray>,
    textHidden: number,
    quant: (path: string) => QuantParams | undefined,
  ) {
    super(tensors);
    this.textHidden = textHidden;
    const param = (p: string): MlxArray => {
      const a = tensors.get(p);
      if (!a) throw new WeightsError(`missing tensor ${p} (vision tower)`);
      return a;
    };
    const mod = (p: string, clippable: boolean): ClipLinear => {
      const base = clippable ? `${p}.linear` : p;
      const q = tensors.has(`${base}.scales`) ? quant(base) : undefined;
      const m: ClipLinear = { weight: param(`${base}.weight`) };
      if (q) {
        m.scales = param(`${base}.scales`);
        const b = tensors.get(`${base}.biases`);
        if (b) m.biases = b;
        m.quant = q;
      }
      if (clippable && config.useClippedLinears) {
        m.clip = { inMin: param(`${p}.input_min`), inMax: param(`${p}.input_max`), outMin: param(`${p}.output_min`), outMax: param(`${p}.output_max`) };
      }
      return m;
    };
    const L = "vision_tower.encoder.layers.";
    this.layers = Array.from({ length: config.numHiddenLayers }, (_, i) => ({
      q: mod(`${L}${i}.self_attn.q_proj`, true),
      k: mod(`${L}${i}.self_attn.k_proj`, true),
      v: mod(`${L}${i}.self_attn.v_proj`, true),
      o: mod(`${L}${i}.self_attn.o_proj`, true),
      qNorm: param(`${L}${i}.self_attn.q_norm.weight`),
      kNorm: param(`${L}${i}.self_attn.k_norm.weight`),
      inputNorm: param(`${L}${i}.input_layernorm.weight`),
      postAttnNorm: param(`${L}${i}.post_attention_layernorm.weight`),
      preFfNorm: param(`${L}${i}.pre_feedforward_layernorm.weight`),
      postFfNorm: param(`${L}${i}.post_feedforward_layernorm.weight`),
      gate: mod(`${L}${i}.mlp.gate_proj`, true),
      up: mod(`${L}${i}.mlp.up_proj`, true),
      down: mod(`${L}${i}.mlp.down_proj`, true),
    }));
    this.inputProj = mod("vision_tower.patch_embedder.input_proj", false);
    this.posTable = param("vision_tower.patch_embedder.position_embedding_table");
    if (config.standardize) {
      this.stdBias = param("vision_tower.std_bias");
      this.stdScale = param("vision_tower.std_scale");
    }
    this.projection = mod("embed_vision.embedding_projection", false);
    const [two, size, hidden] = this.posTable.shape;
    if (two !== 2 || size !== config.positionEmbeddingSize || hidden !== config.hiddenSize) {
      throw new WeightsError(
        `vision_tower.patch_embedder.position_embedding_table is ${this.posTable.describe()}, expected [2, ${config.positionEmbeddingSize}, ${config.hiddenSize}]`,
      );
    }
    // Split the table once into its x and y halves (take on each is the one-hot matmul's value).
    this.posX = this.own(mx.index(this.posTable, 0));
    this.posY = this.own(mx.index(this.posTable, 1));
  }

  readonly inputProj: ClipLinear;
  readonly posTable: MlxArray;
  readonly posX: MlxArray;
  readonly posY: MlxArray;
  readonly stdBias?: MlxArray;
  readonly stdScale?: MlxArray;
  readonly projection: ClipLinear;

  /**
   * The vision side of a checkpoint directory, or null when its config has no vision_config.
   * Reads only the vision_tower.* and embed_vision.* tensors (HF "model."-prefixed names too).
   */
  static load(dir: string, config: Gemma4Config): Gemma4Vision | null {
    const vc = parseVisionConfig(config);
    if (!vc) return null;
    const files = findWeights(dir);
    const want = (n: string): string | null => {
      const k = n.startsWith("model.") ? n.slice("model.".length) : n;
      if (!(k.startsWith("vision_tower.") || k.startsWith("embed_vision."))) return null;
      if (!vc.useClippedLinears && /\.(input|output)_(min|max)$/.test(k)) return null;
      return k;
    };
    const tensors = loadPickedTensors(files, want);
    try {
      if (tensors.size === 0) throw new WeightsError(`${dir}: config.json has a vision_config but the weights have no vision_tower.* tensors`);
      const q = config.quantization;
      const quant = (path: string): QuantParams | undefined => {
        if (!q) return undefined;
        const o = q.overrides.get(path);
        if (o === false) return undefined;
        return o ?? { groupSize: q.groupSize, bits: q.bits, mode: q.mode };
      };
      return new Gemma4Vision(vc, parseMultimodalTokens(config), tensors, config.text.hiddenSize, quant);
    } catch (e) {
      for (const a of tensors.values()) a.dispose();
      throw e;
    }
  }

  #clipLinear(m: ClipLinear, x: MlxArray, s: Scope): MlxArray {
    if (!m.clip) return s.t(linear(m, x));
    const xc = s.t(mx.clip(x, m.clip.inMin, m.clip.inMax));
    const y = s.t(linear(m, xc));
    return s.t(mx.clip(y, m.clip.outMin, m.clip.outMax));
  }

  /** VisionRMSNorm (float32 throughout, weight cast to float32); weightless when w is null. */
  #rmsF32(x: MlxArray, w: MlxArray | null, s: Scope): MlxArray {
    const xf = s.t(mx.astype(x, "float32"));
    const sq = s.t(mx.power(xf, 2));
    const v = s.t(mx.mean(sq, -1, { keepdims: true }));
    const ve = s.t(mx.add(v, this.config.rmsNormEps));
    const r = s.t(mx.rsqrt(ve));
    let n = s.t(mx.multiply(xf, r));
    if (w) {
      const wf = s.t(mx.astype(w, "float32"));
      n = s.t(mx.multiply(n, wf));
    }
    return s.t(mx.astype(n, x.dtype));
  }

  /** apply_multidimensional_rope with 2-D positions [1, L, 2] on [1, L, H, D]. */
  #rope(x: MlxArray, cosSin: { cos: MlxArray; sin: MlxArray }[], s: Scope): MlxArray {
    const D = x.shape[3]!;
    const cpd = cosSin.length ? 2 * Math.floor(D / (2 * cosSin.length)) : D;
    const parts: MlxArray[] = [];
    for (const [d, cs] of cosSin.entries()) {
      const xp = s.t(mx.index(x, "...", mx.sl(d * cpd, (d + 1) * cpd)));
      const x1 = s.t(mx.index(xp, "...", mx.sl(0, cpd / 2)));
      const x2 = s.t(mx.index(xp, "...", mx.sl(cpd / 2, cpd)));
      const nx2 = s.t(mx.negative(x2));
      const rot = s.t(mx.concatenate([nx2, x1], -1));
      const a = s.t(mx.multiply(xp, s.t(mx.astype(cs.cos, x.dtype))));
      const b = s.t(mx.multiply(rot, s.t(mx.astype(cs.sin, x.dtype))));
      parts.push(s.t(mx.add(a, b)));
    }
    return s.t(mx.concatenate(parts, -1));
  }

  /** Per spatial dimension: cos and sin [1, L, 1, cpd] (float32, cast per use). */
  #ropeTables(positions: MlxArray, s: Scope): { cos: MlxArray; sin: MlxArray }[] {
    const D = this.config.headDim;
    const ndim = 2;
    const cpd = 2 * Math.floor(D / (2 * ndim));
    const half = cpd / 2;
    const ar = s.t(mx.arange(0, half));
    const arf = s.t(mx.astype(ar, "float32"));
    const fe = s.t(mx.multiply(2.0 / cpd, arf));
    const ts = s.t(mx.power(this.config.ropeTheta, fe));
    const out: { cos: MlxArray; sin: MlxArray }[] = [];
    for (let d = 0; d < ndim; d++) {
      const p = s.t(mx.index(positions, "...", mx.sl(d, d + 1)));
      const pf = s.t(mx.astype(p, "float32"));
      const si = s.t(mx.divide(pf, ts));
      const c = s.t(mx.cos(si));
      const n = s.t(mx.sin(si));
      const c2 = s.t(mx.concatenate([c, c], -1));
      const n2 = s.t(mx.concatenate([n, n], -1));
      out.push({ cos: s.t(mx.expand_dims(c2, 2)), sin: s.t(mx.expand_dims(n2, 2)) });
    }
    return out;
  }

  /**
   * One image's soft tokens in the text model's space: [n, text hidden] in the projection's
   * dtype (n = the image's soft-token count). The caller owns the result.
   */
  encode(img: PreprocessedImage): MlxArray {
    const c = this.config;
    const p = c.patchSize;
    const pH = Math.floor(img.height / p);
    const pW = Math.floor(img.width / p);
    const N = pH * pW;
    const pool = c.poolingKernelSize;
    const length = Math.floor(N / pool ** 2);
    if (length === 0) throw new WeightsError(`image of ${img.width}x${img.height} has fewer than ${pool}x${pool} patches`);
    if (pW > c.positionEmbeddingSize || pH > c.positionEmbeddingSize) {
      throw new WeightsError(`image of ${pW}x${pH} patches exceeds the position table (${c.positionEmbeddingSize})`);
    }
    using s = new Scope();
    const pv = s.t(MlxArray.fromTypedArray(img.pixels, [1, 3, img.height, img.width], "float32"));
    // _patchify
    const r0 = s.t(mx.reshape(pv, [1, 3, pH, p, pW, p]));
    const r1 = s.t(mx.transpose(r0, [0, 2, 4, 3, 5, 1]));
    const r2 = s.t(mx.reshape(r1, [1, N, 3 * p * p]));
    const r3 = s.t(mx.subtract(r2, 0.5));
    const r4 = s.t(mx.multiply(2, r3));
    const r5 = s.t(mx.astype(r4, this.inputProj.weight.dtype));
    const hp = s.t(linear(this.inputProj, r5));
    // positions (x, y) per patch, row-major over the grid; the one-hot matmul is a gather.
    const xs = new Int32Array(N);
    const ys = new Int32Array(N);
    const pos = new Int32Array(N * 2);
    for (let i = 0; i < N; i++) {
      xs[i] = i % pW;
      ys[i] = Math.floor(i / pW);
      pos[2 * i] = xs[i]!;
      pos[2 * i + 1] = ys[i]!;
    }
    const xi = s.t(MlxArray.fromTypedArray(xs, [N], "int32"));
    const yi = s.t(MlxArray.fromTypedArray(ys, [N], "int32"));
    const ex = s.t(mx.take(this.posX, xi, 0));
    const ey = s.t(mx.take(this.posY, yi, 0));
    const pe = s.t(mx.add(ex, ey));
    const pe1 = s.t(mx.expand_dims(pe, 0));
    let h = s.t(mx.add(hp, pe1));
    // Bidirectional mask over real patches: all zeros (no padding for a single image).
    const mask = s.t(mx.zeros([1, 1, N, N], h.dtype));
    const positions = s.t(MlxArray.fromTypedArray(pos, [1, N, 2], "int32"));
    const tables = this.#ropeTables(positions, s);
    const H = c.numAttentionHeads;
    const KV = c.numKeyValueHeads;
    const D = c.headDim;
    const fused = [64, 80, 128].find((t) => D <= t) ?? D;
    for (const lw of this.layers) {
      const x0 = s.t(mx.fast.rms_norm(h, lw.inputNorm, c.rmsNormEps));
      const q0 = s.t(mx.reshape(this.#clipLinear(lw.q, x0, s), [1, N, H, D]));
      const k0 = s.t(mx.reshape(this.#clipLinear(lw.k, x0, s), [1, N, KV, D]));
      const v0 = s.t(mx.reshape(this.#clipLinear(lw.v, x0, s), [1, N, KV, D]));
      const q1 = this.#rope(this.#rmsF32(q0, lw.qNorm, s), tables, s);
      const k1 = this.#rope(this.#rmsF32(k0, lw.kNorm, s), tables, s);
      const v1 = this.#rmsF32(v0, null, s);
      let q = s.t(mx.transpose(q1, [0, 2, 1, 3]));
      let k = s.t(mx.transpose(k1, [0, 2, 1, 3]));
      let v = s.t(mx.transpose(v1, [0, 2, 1, 3]));
      if (fused !== D) {
        const pad: [number, number][] = [
          [0, 0],
          [0, 0],
          [0, 0],
          [0, fused - D],
        ];
        q = s.t(mx.pad(q, pad));
        k = s.t(mx.pad(k, pad));
        v = s.t(mx.pad(v, pad));
      }
      let att = s.t(mx.fast.scaled_dot_product_attention(q, k, v, { scale: 1.0, mask }));
      if (fused !== D) att = s.t(mx.index(att, "...", mx.sl(0, D)));
      const a1 = s.t(mx.transpose(att, [0, 2, 1, 3]));
      const a2 = s.t(mx.reshape(a1, [1, N, -1]));
      const o = this.#clipLinear(lw.o, a2, s);
      const on = s.t(mx.fast.rms_norm(o, lw.postAttnNorm, c.rmsNormEps));
      h = s.t(mx.add(h, on));
      const f0 = s.t(mx.fast.rms_norm(h, lw.preFfNorm, c.rmsNormEps));
      const g = s.t(geluApprox(this.#clipLinear(lw.gate, f0, s)));
      const u = this.#clipLinear(lw.up, f0, s);
      const gu = s.t(mx.multiply(g, u));
      const d = this.#clipLinear(lw.down, gu, s);
      const dn = s.t(mx.fast.rms_norm(d, lw.postFfNorm, c.rmsNormEps));
      h = s.t(mx.add(h, dn));
    }
    // VisionPooler._avg_pool_by_positions: weights[L, length] = 1/k² where the patch falls in the kernel.
    let pooled: MlxArray;
    if (N === length) pooled = h;
    else {
      const k = Math.floor(Math.sqrt(Math.floor(N / length)));
      const maxX = pW; // max(clamped x) + 1
      const w = new Float32Array(N * length);
      const inv = Math.fround(1 / k ** 2);
      for (let i = 0; i < N; i++) {
        const idx = Math.floor(xs[i]! / k) + Math.floor(maxX / k) * Math.floor(ys[i]! / k);
        if (idx >= 0 && idx < length) w[i * length + idx] = inv;
      }
      const wa = s.t(MlxArray.fromTypedArray(w, [1, N, length], "float32"));
      const wt = s.t(mx.transpose(wa, [0, 2, 1]));
      const hf = s.t(mx.astype(h, "float32"));
      const o = s.t(mx.matmul(wt, hf));
      pooled = s.t(mx.astype(o, h.dtype));
    }
    let out = s.t(mx.multiply(pooled, c.hiddenSize ** 0.5));
    if (this.stdBias && this.stdScale) {
      const b = s.t(mx.subtract(out, this.stdBias));
      out = s.t(mx.multiply(b, this.stdScale));
    }
    const e = embedVision(s, out, this.projection, c.rmsNormEps);
    return mx.reshape(e, [length, this.textHidden]);
  }
}
