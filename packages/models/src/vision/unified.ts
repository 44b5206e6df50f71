// The 12B's (model_type "gemma4_unified") encoder-free image path, as mlx-vlm 0.7.10 computes it
// (mlx_vlm/models/gemma4_unified: processing_gemma4_unified.py _convert_image_to_model_patches and
// _pad_patches, gemma4_unified.py VisionEmbedder and Model.get_image_features): the preprocessed
// image (the same resize/rescale as gemma4's processor) is cut into model patches of
// patch_size x pooling_kernel_size pixels, flattened (row, column, channel), zero padded to the
// soft-token budget with (x, y) position ids -1; then patch LayerNorm -> Linear -> LayerNorm, plus
// the 2-D position embeddings pos_embedding[x, 0] + pos_embedding[y, 1] (zero on padding), pos_norm,
// embed_vision (RMSNorm without scale, projection), and the padding rows dropped. One soft token
// per model patch. Same ops, order and dtypes (docs/images.md).
import { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import type { Gemma4Config } from "../config.ts";
import { ConfigError, WeightsError } from "../errors.ts";
import { linear, type ModuleWeights } from "../model/nn.ts";
import { Scope } from "../model/scope.ts";
import { findWeights, loadPickedTensors } from "../weights.ts";
import { EncoderWeights, embedVision, type MultimodalTokens, type VisionEncoder } from "./encoder.ts";
import type { PreprocessedImage } from "./preprocess.ts";
import { Gemma4Vision, parseMultimodalTokens, parseVisionConfig } from "./tower.ts";

/** gemma4_unified's vision_config (mlx-vlm gemma4_unified/config.py VisionConfig; defaults from there). */
export interface UnifiedVisionConfig {
  modelPatchSize: number;
  mmEmbedDim: number;
  mmPosembSize: number;
  numSoftTokens: number;
  outputProjDims: number;
  rmsNormEps: number;
}

function obj(v: unknown): Record<string, unknown> | null {
  return typeof v === "object" && v !== null && !Array.isArray(v) ? (v as Record<string, unknown>) : null;
}

/**
 * The vision_config of a gemma4_unified checkpoint, or null for any other model type. An absent
 * vision_config takes mlx-vlm's defaults (its ModelConfig has a default VisionConfig); an explicit
 * null means no vision embedder.
 */
export function parseUnifiedVisionConfig(config: Gemma4Config): UnifiedVisionConfig | null {
  if (config.modelType !== "gemma4_unified") return null;
  if (config.raw.vision_config === null) return null;
  const vc = obj(config.raw.vision_config) ?? {};
  const int = (k: string, d: number): number => {
    const v = vc[k] ?? d;
    if (typeof v !== "number" || !Number.isInteger(v) || v <= 0)
      throw new ConfigError(`config.json: vision_config.${k} must be a positive integer, got ${JSON.stringify(v)}`);
    return v;
  };
  const eps = vc.rms_norm_eps ?? 1e-6;
  if (typeof eps !== "number" || !(eps > 0)) throw new ConfigError(`config.json: vision_config.rms_norm_eps must be a positive number`);
  const c: UnifiedVisionConfig = {
    modelPatchSize: int("model_patch_size", 48),
    mmEmbedDim: int("mm_embed_dim", 3840),
    mmPosembSize: int("mm_posemb_size", 1120),
    numSoftTokens: int("num_soft_tokens", 280),
    outputProjDims: int("output_proj_dims", 3840),
    rmsNormEps: eps,
  };
  if (c.outputProjDims !== c.mmEmbedDim)
    throw new ConfigError(
      `config.json: vision_config.output_proj_dims (${c.outputProjDims}) must equal mm_embed_dim (${c.mmEmbedDim}) (embed_vision reads the embedder's output)`,
    );
  return c;
}

/** Whether a checkpoint takes images (a gemma4 vision tower or a gemma4_unified vision embedder). */
export function takesImages(config: Gemma4Config): boolean {
  return parseVisionConfig(config) !== null || parseUnifiedVisionConfig(config) !== null;
}

/** Model patches of one image, as Gemma4UnifiedImageProcessor gives them (padded). */
export interface ModelPatches {
  /** [padTo, 3·p²] float32, each patch flattened (row, column, channel); zero rows past `count`. */
  patches: Float32Array;
  /** [padTo, 2] (x, y) per patch, row-major over the grid; -1 past `count`. */
  positions: Int32Array;
  count: number;
  patchDim: number;
}

/**
 * _convert_image_to_model_patches + _pad_patches on a preprocessed image ([3, H, W] float32): pure
 * data movement. `padTo` is the processor's max_soft_tokens (the image's patches must fit in it).
 */
export function modelPatches(img: PreprocessedImage, patch: number, padTo: number): ModelPatches {
  const { height: H, width: W } = img;
  if (H % patch !== 0 || W % patch !== 0)
    throw new WeightsError(
      `image of ${W}x${H} is not a whole number of ${patch}x${patch} model patches (the processor's patch_size x pooling_kernel_size must equal vision_config.model_patch_size)`,
    );
  const pH = H / patch;
  const pW = W / patch;
  const count = pH * pW;
  if (count > padTo) throw new WeightsError(`image of ${W}x${H} gives ${count} model patches, more than the budget of ${padTo}`);
  const dim = 3 * patch * patch;
  const patches = new Float32Array(padTo * dim);
  const positions = new Int32Array(padTo * 2).fill(-1);
  const plane = H * W;
  for (let py = 0; py < pH; py++) {
    for (let px = 0; px < pW; px++) {
      const n = py * pW + px;
      positions[2 * n] = px;
      positions[2 * n + 1] = py;
      let o = n * dim;
      for (let r = 0; r < patch; r++) {
        const row = (py * patch + r) * W + px * patch;
        for (let col = 0; col < patch; col++) {
          for (let ch = 0; ch < 3; ch++) patches[o++] = img.pixels[ch * plane + row + col]!;
        }
      }
    }
  }
  return { patches, positions, count, patchDim: dim };
}

interface LayerNormWeights {
  weight: MlxArray;
  bias: MlxArray;
}

/** nn.LayerNorm's default eps (mlx-vlm's VisionEmbedder does not set one). */
const LAYER_NORM_EPS = 1e-5;

/** gemma4_unified's VisionEmbedder + embed_vision; owns its weights. */
export class Gemma4UnifiedVision extends EncoderWeights implements VisionEncoder {
  readonly patchLn1: LayerNormWeights;
  readonly patchDense: ModuleWeights & { bias: MlxArray };
  readonly patchLn2: LayerNormWeights;
  readonly posNorm: LayerNormWeights;
  readonly posX: MlxArray;
  readonly posY: MlxArray;
  readonly projection: ModuleWeights;

  private constructor(
    readonly config: UnifiedVisionConfig,
    readonly tokens: MultimodalTokens,
    readonly textHidden: number,
    tensors: Map<string, MlxArray>,
  ) {
    super(tensors);
    const param = (p: string, shape: number[]): MlxArray => {
      const a = tensors.get(p);
      if (!a) throw new WeightsError(`missing tensor ${p} (vision embedder)`);
      if (a.shape.length !== shape.length || a.shape.some((d, i) => d !== shape[i]))
        throw new WeightsError(`${p} is ${a.describe()}, expected [${shape.join(", ")}]`);
      return a;
    };
    const quantized = [...tensors.keys()].filter((k) => k.endsWith(".scales"));
    if (quantized.length) throw new WeightsError(`quantized vision embedder tensors are not supported (${quantized.join(", ")})`);
    const P = 3 * config.modelPatchSize ** 2;
    const D = config.mmEmbedDim;
    const ln = (p: string, d: number): LayerNormWeights => ({ weight: param(`${p}.weight`, [d]), bias: param(`${p}.bias`, [d]) });
    this.patchLn1 = ln("vision_embedder.patch_ln1", P);
    this.patchDense = { weight: param("vision_embedder.patch_dense.weight", [D, P]), bias: param("vision_embedder.patch_dense.bias", [D]) };
    this.patchLn2 = ln("vision_embedder.patch_ln2", D);
    this.posNorm = ln("vision_embedder.pos_norm", D);
    const table = param("vision_embedder.pos_embedding", [config.mmPosembSize, 2, D]);
    this.projection = { weight: param("embed_vision.embedding_projection.weight", [textHidden, config.outputProjDims]) };
    // pos_embedding[i, 0] / [i, 1]: the x and y columns, gathered per patch (mlx-vlm's fancy index).
    this.posX = this.own(mx.index(table, mx.sl(), 0));
    this.posY = this.own(mx.index(table, mx.sl(), 1));
  }

  /**
   * The vision embedder of a gemma4_unified checkpoint directory, or null when its config has
   * none. Reads only the vision_embedder.* and embed_vision.* tensors (HF "model."-prefixed too).
   */
  static load(dir: string, config: Gemma4Config): Gemma4UnifiedVision | null {
    const vc = parseUnifiedVisionConfig(config);
    if (!vc) return null;
    const files = findWeights(dir);
    const tensors = loadPickedTensors(files, (n) => {
      const k = n.startsWith("model.") ? n.slice("model.".length) : n;
      return k.startsWith("vision_embedder.") || k.startsWith("embed_vision.") ? k : null;
    });
    try {
      if (tensors.size === 0)
        throw new WeightsError(`${dir}: config.json is gemma4_unified with a vision_config but the weights have no vision_embedder.* tensors`);
      return new Gemma4UnifiedVision(vc, parseMultimodalTokens(config), config.text.hiddenSize, tensors);
    } catch (e) {
      for (const a of tensors.values()) a.dispose();
      throw e;
    }
  }

  /**
   * One image's soft tokens in the text model's space: [n, text hidden] in the projection's dtype
   * (n = the image's model patches = its soft-token count). The patches are padded to
   * vision_config.num_soft_tokens as the processor pads them, and the padding rows dropped after
   * embed_vision (get_image_features' compaction). The caller owns the result.
   */
  encode(img: PreprocessedImage): MlxArray {
    const c = this.config;
    const padTo = Math.max(c.numSoftTokens, img.softTokens);
    const mp = modelPatches(img, c.modelPatchSize, padTo);
    if (mp.count !== img.softTokens)
      throw new WeightsError(
        `image of ${img.width}x${img.height} gives ${mp.count} model patches but ${img.softTokens} soft tokens (processor and vision_config disagree)`,
      );
    const maxPos = mp.positions.reduce((m, v) => Math.max(m, v), 0);
    if (maxPos >= c.mmPosembSize)
      throw new WeightsError(`image of ${img.width}x${img.height} spans ${maxPos + 1} model patches, beyond the position table (${c.mmPosembSize})`);
    using s = new Scope();
    const N = padTo;
    const x0 = s.t(MlxArray.fromTypedArray(mp.patches, [1, N, mp.patchDim], "float32"));
    const h1 = s.t(mx.fast.layer_norm(x0, this.patchLn1.weight, this.patchLn1.bias, LAYER_NORM_EPS));
    const wt = s.t(mx.transpose(this.patchDense.weight));
    const h2 = s.t(mx.addmm(this.patchDense.bias, h1, wt));
    const h3 = s.t(mx.fast.layer_norm(h2, this.patchLn2.weight, this.patchLn2.bias, LAYER_NORM_EPS));
    // clamped = maximum(ids, 0); valid = (ids != -1) in the hidden dtype.
    const xi = new Int32Array(N);
    const yi = new Int32Array(N);
    const vx = new Float32Array(N);
    const vy = new Float32Array(N);
    for (let i = 0; i < N; i++) {
      const x = mp.positions[2 * i]!;
      const y = mp.positions[2 * i + 1]!;
      xi[i] = Math.max(x, 0);
      yi[i] = Math.max(y, 0);
      vx[i] = x !== -1 ? 1 : 0;
      vy[i] = y !== -1 ? 1 : 0;
    }
    const xPos = s.t(mx.take(this.posX, s.t(MlxArray.fromTypedArray(xi, [1, N], "int32")), 0));
    const yPos = s.t(mx.take(this.posY, s.t(MlxArray.fromTypedArray(yi, [1, N], "int32")), 0));
    const vxa = s.t(mx.astype(s.t(MlxArray.fromTypedArray(vx, [1, N, 1], "float32")), h3.dtype));
    const vya = s.t(mx.astype(s.t(MlxArray.fromTypedArray(vy, [1, N, 1], "float32")), h3.dtype));
    const pe = s.t(mx.add(s.t(mx.multiply(xPos, vxa)), s.t(mx.multiply(yPos, vya))));
    const h4 = s.t(mx.add(h3, pe));
    const h5 = s.t(mx.fast.layer_norm(h4, this.posNorm.weight, this.posNorm.bias, LAYER_NORM_EPS));
    const e = embedVision(s, h5, this.projection, c.rmsNormEps);
    const kept = s.t(mx.index(e, 0, mx.sl(0, mp.count)));
    return mx.reshape(kept, [mp.count, this.textHidden]);
  }
}

/** The image encoder of a checkpoint (gemma4: the vision tower; gemma4_unified: the vision embedder), or null. */
export function loadVisionEncoder(dir: string, config: Gemma4Config): VisionEncoder | null {
  if (config.modelType === "gemma4_unified") return Gemma4UnifiedVision.load(dir, config);
  return Gemma4Vision.load(dir, config);
}
