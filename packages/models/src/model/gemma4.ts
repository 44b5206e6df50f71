// Gemma 4 text model (gemma4_text.py): weights resolved once, then one forward pass for every
// config, which picks the blocks per layer from its spec at run time. It issues the same ops in
// the same order and dtypes as mlx-lm, so logits match it bit for bit (docs/gemma4.md), but for
// decode's fused projections: fewer quantized matmuls, the same bits (docs/fused-projections.md).
import { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { type Cache, KVCache, type Mask, RotatingKVCache } from "@mlx-bun/kv-cache";
import { type Gemma4Config, type LayerSpec, type LayerType, layerSpecs } from "../config.ts";
import { expectedTensors } from "../weights.ts";
import { WeightsError } from "../errors.ts";
import {
  attentionOwn,
  attentionShared,
  type EmbeddedInputs,
  embedInputs,
  feedForwardDense,
  feedForwardMoe,
  finalLogits,
  firstHidden,
  type Hidden,
  layerEnd,
  type LayerWeights,
  layerMask,
  type ModelConsts,
  type ModelParts,
  nextNorm,
  perLayerInput,
  releaseShared,
  type Shared,
} from "./blocks.ts";
import { codecFor, type KvMode } from "./kv-mode.ts";
import { fusedProjections, fuseLinears } from "./fused-linear.ts";
import { embed, type ModuleWeights, moduleWeights } from "./nn.ts";
import { Scalars } from "./scalars.ts";
import { Scope } from "./scope.ts";

/** Extra inputs of a forward pass with media (src/vision builds them; the caller owns the arrays). */
export interface ForwardInputs {
  embedded?: EmbeddedInputs;
  masks?: Map<LayerType, Mask>;
}

export class Gemma4Model implements Disposable {
  readonly specs: LayerSpec[];
  readonly firstShared: number;
  readonly parts: ModelParts;
  readonly consts: ModelConsts;
  /** Every linear/embedding module by its mlx-lm path (for adapters). */
  readonly modules = new Map<string, ModuleWeights>();
  #owned: MlxArray[] = [];

  constructor(
    readonly config: Gemma4Config,
    tensors: Map<string, MlxArray>,
  ) {
    const t = config.text;
    const info = new Map([...tensors].map(([n, a]) => [n, { shape: [...a.shape], dtype: a.dtype }]));
    const manifest = expectedTensors(config, { actual: info });
    const M = `${config.prefix}model.`;
    const mod = (path: string): ModuleWeights => {
      const m = moduleWeights(tensors, path, manifest.get(`${path}.weight`)?.quant);
      this.modules.set(path, m);
      return m;
    };
    const param = (path: string): MlxArray => {
      const a = tensors.get(path);
      if (!a) throw new WeightsError(`missing tensor ${path}`);
      return a;
    };
    this.specs = layerSpecs(t);
    this.firstShared = t.numHiddenLayers - t.numKvSharedLayers;
    const ropeFreqs = layerRopeFreqs(this.specs, this.#owned);
    const layers: LayerWeights[] = this.specs.map((s, i) => {
      const L = `${M}layers.${s.index}.`;
      const freqs = ropeFreqs[i];
      return {
        spec: s,
        q: mod(`${L}self_attn.q_proj`),
        ...(s.hasKv ? { k: mod(`${L}self_attn.k_proj`), kNorm: param(`${L}self_attn.k_norm.weight`) } : {}),
        ...(s.hasKv && !s.kEqV ? { v: mod(`${L}self_attn.v_proj`) } : {}),
        o: mod(`${L}self_attn.o_proj`),
        qNorm: param(`${L}self_attn.q_norm.weight`),
        inputNorm: param(`${L}input_layernorm.weight`),
        postAttnNorm: param(`${L}post_attention_layernorm.weight`),
        preFfNorm: param(`${L}pre_feedforward_layernorm.weight`),
        postFfNorm: param(`${L}post_feedforward_layernorm.weight`),
        gate: mod(`${L}mlp.gate_proj`),
        up: mod(`${L}mlp.up_proj`),
        down: mod(`${L}mlp.down_proj`),
        ...(t.enableMoeBlock
          ? {
              moe: {
                proj: mod(`${L}router.proj`),
                scale: param(`${L}router.scale`),
                perExpertScale: param(`${L}router.per_expert_scale`),
                gate: mod(`${L}experts.switch_glu.gate_proj`),
                up: mod(`${L}experts.switch_glu.up_proj`),
                down: mod(`${L}experts.switch_glu.down_proj`),
                postFf1: param(`${L}post_feedforward_layernorm_1.weight`),
                postFf2: param(`${L}post_feedforward_layernorm_2.weight`),
                preFf2: param(`${L}pre_feedforward_layernorm_2.weight`),
              },
            }
          : {}),
        ...(t.hiddenSizePerLayerInput
          ? {
              ple: {
                gate: mod(`${L}per_layer_input_gate`),
                proj: mod(`${L}per_layer_projection`),
                norm: param(`${L}post_per_layer_input_norm.weight`),
              },
            }
          : {}),
        layerScalar: param(`${L}layer_scalar`),
        ...(freqs ? { freqs } : {}),
      };
    });
    const embedW = mod(`${M}embed_tokens`);
    this.parts = {
      layers,
      embed: embedW,
      norm: param(`${M}norm.weight`),
      lmHead: t.tieWordEmbeddings ? embedW : mod(`${config.prefix}lm_head`),
      tied: t.tieWordEmbeddings,
      ...(t.hiddenSizePerLayerInput
        ? {
            ple: {
              embed: mod(`${M}embed_tokens_per_layer`),
              proj: mod(`${M}per_layer_model_projection`),
              norm: param(`${M}per_layer_projection_norm.weight`),
            },
          }
        : {}),
    };
    this.consts = {
      hiddenSize: t.hiddenSize,
      numLayers: t.numHiddenLayers,
      eps: t.rmsNormEps,
      hiddenPerLayer: t.hiddenSizePerLayerInput,
      softcap: t.finalLogitSoftcapping,
      topK: t.topKExperts ?? 0,
      scalars: new Scalars(),
    };
    // Last, once every tensor was found: nothing can fail after the fused tensors are made.
    fusedProjections(); // a bad MLX_BUN_FUSED_PROJECTIONS fails the load, not the first step
    this.#fuseProjections(layers, tensors);
  }

  /**
   * Caches for the layers that own K/V, as mlx-lm's make_cache: full → KVCache (a
   * RotatingKVCache of `maxKvSize` when given), sliding → RotatingKVCache(sliding_window).
   * `mode` picks the codec; `slidingMode` (default: the same) the sliding layers' codec.
   */
  makeCaches(mode: KvMode = { kind: "bf16" }, opts: { maxKvSize?: number; slidingMode?: KvMode } = {}): Cache[] {
    const codec = codecFor(mode);
    const slidingCodec = opts.slidingMode ? codecFor(opts.slidingMode) : codec;
    const t = this.config.text;
    return this.specs
      .slice(0, this.firstShared)
      .map((s) =>
        s.type === "full_attention"
          ? opts.maxKvSize
            ? new RotatingKVCache(opts.maxKvSize, 0, codec)
            : new KVCache(codec)
          : new RotatingKVCache(t.slidingWindow, 0, slidingCodec),
      );
  }

  /**
   * Logits [B, L, vocab] for token ids [B, L] (int32), appending to `caches` (or none). `inputs`
   * (images, src/vision): the embeddings with soft tokens in place and masks per layer type that
   * replace the default ones (mlx-vlm's bidirectional image overlay).
   */
  forward(ids: MlxArray, caches: Cache[] | null = null, inputs?: ForwardInputs): MlxArray {
    using s = new Scope();
    return finalLogits(this.parts, this.consts, this.#layers(ids, caches, s, inputs).n, s);
  }

  /**
   * The last layer's output before the final norm [B, L, hidden] and the logits of `forward` (the
   * same ops: logits = logitsFromHidden(hidden)). Speculative decoding with an MTP drafter reads
   * the hidden state (mlx-vlm's skip_final_norm hidden). The caller owns both.
   */
  forwardHidden(ids: MlxArray, caches: Cache[] | null = null): { hidden: MlxArray; logits: MlxArray } {
    using s = new Scope();
    const { h, n } = this.#layers(ids, caches, s);
    const logits = finalLogits(this.parts, this.consts, n, s);
    return { hidden: h.retain(), logits };
  }

  /** The final norm of the model (mlx-vlm's speculative_draft_hidden: what an MTP drafter reads). */
  finalNorm(hidden: MlxArray): MlxArray {
    return mx.fast.rms_norm(hidden, this.parts.norm, this.consts.eps);
  }

  /** Embeddings × √hidden of token ids [B, L] (the input scaling of the first layer). */
  embedScaled(ids: MlxArray): MlxArray {
    using e = embed(this.parts.embed, ids);
    return mx.multiply(e, this.consts.scalars.like(this.consts.hiddenSize ** 0.5, e));
  }

  /** The layers of the forward pass; returns h before the final norm and its final norm (tracked by `s`). */
  #layers(ids: MlxArray, caches: Cache[] | null, s: Scope, inputs?: ForwardInputs): Hidden {
    if (ids.ndim !== 2) throw new WeightsError(`Gemma4Model.forward: ids must be [B, L], got ${ids.describe()}`);
    if (caches && caches.length !== this.firstShared) {
      throw new WeightsError(`Gemma4Model.forward: ${caches.length} caches given, the model needs ${this.firstShared}`);
    }
    const c = this.consts;
    const [B, N] = ids.shape as [number, number];
    const { h: embedded, perLayer } = embedInputs(this.parts, c, ids, s, inputs?.embedded);
    const masks = new Map<LayerType, Mask>();
    for (const spec of this.specs) {
      if (masks.has(spec.type)) continue;
      const given = inputs?.masks?.get(spec.type);
      if (given) {
        masks.set(spec.type, given);
        continue;
      }
      masks.set(spec.type, layerMask(caches && spec.index < this.firstShared ? caches[spec.index]! : null, N, spec.window, s));
    }
    const shared: (Shared | undefined)[] = new Array(this.specs.length);
    const positions = new Map<string, MlxArray>();
    const layers = this.parts.layers;
    let x = firstHidden(embedded, layers, c.eps, s);
    try {
      layers.forEach((lw, i) => {
        const spec = lw.spec;
        const mask = masks.get(spec.type)!;
        let a: Hidden;
        if (spec.hasKv) {
          const r = attentionOwn(lw, x, mask, caches ? caches[spec.index]! : null, positions, B, N, c.eps, s);
          a = r.h;
          shared[spec.index] = r.shared;
        } else a = attentionShared(lw, x, mask, shared[spec.kvSource], B, N, c.eps, s);
        const ff = lw.moe ? feedForwardMoe(lw, a, c, s) : feedForwardDense(lw, a, s);
        const input = perLayer && lw.ple ? perLayerInput(perLayer, spec.index, s) : undefined;
        x = layerEnd(lw, a.h, ff, input, nextNorm(layers, i, this.parts.norm), c.eps, s);
      });
    } finally {
      releaseShared(shared);
    }
    return x;
  }

  /** q/k/v and gate/up of each layer as one quantized matmul at decode (fused-linear.ts); the tensors map gets the row views. */
  #fuseProjections(layers: LayerWeights[], tensors: Map<string, MlxArray>): void {
    const keyOf = new Map<MlxArray, string>();
    for (const [k, a] of tensors) keyOf.set(a, k);
    const replace = (old: MlxArray, view: MlxArray): void => {
      const key = keyOf.get(old);
      if (key === undefined) {
        this.#owned.push(view);
        return;
      }
      tensors.set(key, view);
      keyOf.delete(old);
      old.dispose();
    };
    for (const lw of layers) {
      const qkv = lw.k ? fuseLinears([lw.q, lw.k, ...(lw.v ? [lw.v] : [])], this.#owned, replace) : null;
      const gateUp = fuseLinears([lw.gate, lw.up], this.#owned, replace);
      if (qkv || gateUp) lw.fused = { ...(qkv ? { qkv } : {}), ...(gateUp ? { gateUp } : {}) };
    }
  }

  dispose(): void {
    for (const a of this.#owned) a.dispose();
    this.#owned = [];
    this.consts.scalars.dispose();
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}

/**
 * The RoPE frequencies of each layer spec (undefined for the default RoPE): ProportionalRoPE's are
 * made once per layer type and pushed to `owned`, which the caller disposes.
 */
export function layerRopeFreqs(specs: readonly LayerSpec[], owned: MlxArray[]): (MlxArray | undefined)[] {
  const byType = new Map<LayerType, MlxArray>();
  return specs.map((s) => {
    if (s.rope.type !== "proportional") return undefined;
    let f = byType.get(s.type);
    if (!f) {
      f = proportionalFreqs(s.rope.dims, s.rope.rotatedDims, s.rope.theta, s.rope.factor);
      byType.set(s.type, f);
      owned.push(f);
    }
    return f;
  });
}

/** ProportionalRoPE's frequencies (rope_utils.py:214-220), same ops. */
export function proportionalFreqs(dims: number, rotated: number, base: number, factor: number): MlxArray {
  using ar = mx.arange(0, rotated, 2, { dtype: "float32" });
  using exps = mx.divide(ar, dims);
  using pw = mx.power(base, exps);
  using f = mx.multiply(factor, pw);
  using inf = mx.full([(dims - rotated) >> 1], Number.POSITIVE_INFINITY);
  return mx.concatenate([f, inf], 0);
}
