// Gemma 4 MTP drafter ("assistant" model): mlx-vlm 0.7.10's Gemma4AssistantDraftModel
// (speculative/drafters/gemma4_assistant). It reads the target's hidden state and attends over the
// target's K/V (its layers have queries only); one step maps [embed(token), hidden] to the next
// hidden state and logits. Same ops and order as mlx-vlm (docs/speculative.md).
import { join } from "node:path";
import type { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import type { KvView, Mask } from "@mlx-bun/kv-cache";
import {
  type Gemma4AssistantConfig,
  type Gemma4Config,
  type LayerSpec,
  type LayerType,
  layerSpecs,
  parseGemma4AssistantConfig,
  type QuantParams,
  readJson,
} from "../config.ts";
import { WeightsError } from "../errors.ts";
import { findWeights, loadPickedTensors } from "../weights.ts";
import { attentionShared, feedForwardDense, feedForwardMoe, firstHidden, layerEnd, type LayerWeights, type ModelConsts, nextNorm } from "./blocks.ts";
import { layerRopeFreqs } from "./gemma4.ts";
import { embed, embedAsLinear, linear, type ModuleWeights } from "./nn.ts";
import { Scalars } from "./scalars.ts";
import { Scope } from "./scope.ts";

/** What one drafter layer type attends over: the target's K/V view and its mask. */
export interface DrafterKv {
  view: KvView;
  mask: Mask;
}

export class Gemma4Assistant implements Disposable {
  readonly specs: LayerSpec[];
  readonly layers: LayerWeights[];
  readonly consts: ModelConsts;
  readonly embedTokens: ModuleWeights;
  readonly norm: MlxArray;
  readonly preProjection: ModuleWeights;
  readonly postProjection: ModuleWeights;
  readonly lmHead: ModuleWeights | null;
  /** The centroid-routed head: centroids linear and token_ordering as int32 [numCentroids, vocab / numCentroids]. */
  readonly masked: { centroids: ModuleWeights; ordering: MlxArray } | null;
  #owned: MlxArray[] = [];

  constructor(
    readonly config: Gemma4AssistantConfig,
    tensors: Map<string, MlxArray>,
    readonly source = config.source,
  ) {
    const t = config.text;
    const used = new Set<string>();
    const q = config.quantization;
    const mod = (path: string, shape: number[]): ModuleWeights => {
      const w = tensors.get(`${path}.weight`);
      if (!w) throw new WeightsError(`${source}: missing tensor ${path}.weight`);
      used.add(`${path}.weight`);
      const scales = tensors.get(`${path}.scales`);
      if (!scales) {
        if (w.shape.join(",") !== shape.join(","))
          throw new WeightsError(`${source}: tensor ${path}.weight has shape [${w.shape.join(", ")}], expected [${shape.join(", ")}]`);
        return { weight: w };
      }
      if (!q) throw new WeightsError(`${source}: tensor ${path}.scales (a quantized module) but config.json has no "quantization" block`);
      const o = q.overrides.get(path);
      if (o === false) throw new WeightsError(`${source}: tensor ${path}.scales, but config.json quantization.${path} is false`);
      const quant: QuantParams = o ?? { groupSize: q.groupSize, bits: q.bits, mode: q.mode };
      used.add(`${path}.scales`);
      const biases = tensors.get(`${path}.biases`);
      if (biases) used.add(`${path}.biases`);
      const packed = (shape[shape.length - 1]! * quant.bits) / 32;
      if (w.shape[w.ndim - 1] !== packed || w.shape[0] !== shape[0])
        throw new WeightsError(
          `${source}: tensor ${path}.weight has shape [${w.shape.join(", ")}], expected [${shape[0]}, ${packed}] (${quant.bits}-bit, ${shape.join("x")})`,
        );
      return { weight: w, scales, ...(biases ? { biases } : {}), quant };
    };
    const param = (path: string, shape: number[]): MlxArray => {
      const a = tensors.get(path);
      if (!a) throw new WeightsError(`${source}: missing tensor ${path}`);
      if (a.shape.join(",") !== shape.join(","))
        throw new WeightsError(`${source}: tensor ${path} has shape [${a.shape.join(", ")}], expected [${shape.join(", ")}]`);
      used.add(path);
      return a;
    };
    const H = t.hiddenSize;
    this.specs = layerSpecs(t);
    const ropeFreqs = layerRopeFreqs(this.specs, this.#owned);
    this.layers = this.specs.map((s, i) => {
      const L = `model.layers.${s.index}.`;
      const freqs = ropeFreqs[i];
      const inter = s.mlpIntermediateSize;
      const lw: LayerWeights = {
        spec: s,
        q: mod(`${L}self_attn.q_proj`, [s.numHeads * s.headDim, H]),
        o: mod(`${L}self_attn.o_proj`, [H, s.numHeads * s.headDim]),
        qNorm: param(`${L}self_attn.q_norm.weight`, [s.headDim]),
        inputNorm: param(`${L}input_layernorm.weight`, [H]),
        postAttnNorm: param(`${L}post_attention_layernorm.weight`, [H]),
        preFfNorm: param(`${L}pre_feedforward_layernorm.weight`, [H]),
        postFfNorm: param(`${L}post_feedforward_layernorm.weight`, [H]),
        gate: mod(`${L}mlp.gate_proj`, [inter, H]),
        up: mod(`${L}mlp.up_proj`, [inter, H]),
        down: mod(`${L}mlp.down_proj`, [H, inter]),
        layerScalar: param(`${L}layer_scalar`, [1]),
        ...(freqs ? { freqs } : {}),
      };
      if (t.enableMoeBlock) {
        const E = t.numExperts!;
        const mi = t.moeIntermediateSize!;
        lw.moe = {
          proj: mod(`${L}router.proj`, [E, H]),
          scale: param(`${L}router.scale`, [H]),
          perExpertScale: param(`${L}router.per_expert_scale`, [E]),
          gate: mod(`${L}experts.switch_glu.gate_proj`, [E, mi, H]),
          up: mod(`${L}experts.switch_glu.up_proj`, [E, mi, H]),
          down: mod(`${L}experts.switch_glu.down_proj`, [E, H, mi]),
          postFf1: param(`${L}post_feedforward_layernorm_1.weight`, [H]),
          postFf2: param(`${L}post_feedforward_layernorm_2.weight`, [H]),
          preFf2: param(`${L}pre_feedforward_layernorm_2.weight`, [H]),
        };
      }
      // Per-layer-input modules exist in mlx-vlm's DecoderLayer when the config names a size, but
      // the drafter passes no per-layer input, so they never run: accepted and unused.
      for (const n of ["per_layer_input_gate", "per_layer_projection", "post_per_layer_input_norm"])
        for (const suf of [".weight", ".scales", ".biases"]) if (tensors.has(`${L}${n}${suf}`)) used.add(`${L}${n}${suf}`);
      return lw;
    });
    this.embedTokens = mod("model.embed_tokens", [t.vocabSize, H]);
    this.norm = param("model.norm.weight", [H]);
    this.preProjection = mod("pre_projection", [H, 2 * config.backboneHiddenSize]);
    this.postProjection = mod("post_projection", [config.backboneHiddenSize, H]);
    // mlx-vlm's sanitize drops lm_head.weight of a tied drafter.
    for (const suf of [".weight", ".scales", ".biases"]) if (config.tieWordEmbeddings && tensors.has(`lm_head${suf}`)) used.add(`lm_head${suf}`);
    this.lmHead = config.tieWordEmbeddings ? null : mod("lm_head", [t.vocabSize, H]);
    if (config.useOrderedEmbeddings) {
      const ord = tensors.get("masked_embedding.token_ordering");
      if (!ord) throw new WeightsError(`${source}: missing tensor masked_embedding.token_ordering (use_ordered_embeddings is true)`);
      if (ord.size !== t.vocabSize)
        throw new WeightsError(`${source}: tensor masked_embedding.token_ordering has ${ord.size} entries, expected vocab_size ${t.vocabSize}`);
      used.add("masked_embedding.token_ordering");
      using o32 = mx.astype(ord, "int32");
      const ordering = mx.reshape(o32, [config.numCentroids, t.vocabSize / config.numCentroids]);
      this.#owned.push(ordering);
      this.masked = { centroids: mod("masked_embedding.centroids", [config.numCentroids, H]), ordering };
    } else this.masked = null;
    const extra = [...tensors.keys()].filter((n) => !used.has(n));
    if (extra.length) {
      this.dispose();
      throw new WeightsError(
        `${source}: unexpected tensors for this gemma4_assistant config: ${extra.slice(0, 5).join(", ")}${extra.length > 5 ? ` and ${extra.length - 5} more` : ""}`,
      );
    }
    this.consts = {
      hiddenSize: H,
      numLayers: t.numHiddenLayers,
      eps: t.rmsNormEps,
      hiddenPerLayer: 0,
      softcap: null,
      topK: t.topKExperts ?? 0,
      scalars: new Scalars(),
    };
  }

  /** Draft tokens per round its checkpoint was made for (block_size - 1). */
  get defaultDraftTokens(): number {
    return this.config.blockSize - 1;
  }

  /** The layer types the drafter attends over (each reads the target's last K/V-owning layer of that type). */
  get layerTypes(): LayerType[] {
    return [...new Set(this.specs.map((s) => s.type))];
  }

  /**
   * Refuse a target this drafter was not made for, naming the field: hidden size, vocabulary, and
   * per layer type the K/V shape (head dim, KV heads) the drafter's queries attend over.
   */
  checkTarget(target: Gemma4Config): void {
    const tt = target.text;
    const where = this.source;
    if (this.config.backboneHiddenSize !== tt.hiddenSize)
      throw new WeightsError(
        `${where}: backbone_hidden_size ${this.config.backboneHiddenSize} differs from the target's hidden_size ${tt.hiddenSize} (${target.source}); use the drafter made for this target`,
      );
    if (this.config.text.vocabSize !== tt.vocabSize)
      throw new WeightsError(`${where}: text_config.vocab_size ${this.config.text.vocabSize} differs from the target's ${tt.vocabSize} (${target.source})`);
    const targetSpecs = layerSpecs(tt).filter((s) => s.hasKv);
    for (const s of this.specs) {
      const owner = targetSpecs.filter((x) => x.type === s.type).at(-1);
      if (!owner)
        throw new WeightsError(`${where}: layer ${s.index} is ${s.type}, but the target (${target.source}) has no ${s.type} layer whose K/V it could read`);
      if (owner.headDim !== s.headDim || this.config.text.numAttentionHeads % owner.numKvHeads !== 0)
        throw new WeightsError(
          `${where}: layer ${s.index} (${s.type}) has head_dim ${s.headDim} and ${s.numHeads} heads, the target's K/V there has head_dim ${owner.headDim} and ${owner.numKvHeads} KV heads (${target.source})`,
        );
    }
  }

  /**
   * One drafter step (mlx-vlm's _forward_hidden): `inputs` [B, 1, 2 · backbone] =
   * [target embed(token) · √hidden, hidden], queries at `position` over the target's K/V per
   * layer type. Returns the next hidden (post_projection) and the normed state for the head.
   */
  step(inputs: MlxArray, kv: ReadonlyMap<LayerType, DrafterKv>, position: MlxArray): { hidden: MlxArray; normed: MlxArray } {
    const [B, N] = inputs.shape as [number, number];
    using s = new Scope();
    const h = s.t(linear(this.preProjection, inputs));
    const c = this.consts;
    const layers = this.layers;
    let x = firstHidden(h, layers, c.eps, s);
    layers.forEach((lw, i) => {
      const k = kv.get(lw.spec.type);
      if (!k) throw new WeightsError(`Gemma4Assistant.step: no target K/V for ${lw.spec.type} layers`);
      const a = attentionShared(lw, x, k.mask, { view: k.view, offset: position }, B, N, c.eps, s);
      const ff = lw.moe ? feedForwardMoe(lw, a, c, s) : feedForwardDense(lw, a, s);
      x = layerEnd(lw, a.h, ff, undefined, nextNorm(layers, i, this.norm), c.eps, s);
    });
    const normed = x.n.retain();
    return { hidden: linear(this.postProjection, normed), normed };
  }

  /** Logits [B, L, vocab] of a normed state: tied embedding, lm_head, or the centroid head (masked entries get min - 1). */
  logits(normed: MlxArray): MlxArray {
    if (this.masked) {
      using sel = this.#selected(normed);
      const [B, L] = normed.shape as [number, number];
      using lo = mx.min(sel.logits);
      using fill = mx.subtract(lo, 1);
      using fillT = mx.astype(fill, normed.dtype);
      using base = mx.full([B, L, this.config.text.vocabSize], fillT, normed.dtype);
      using idx = mx.reshape(sel.canonical, [B, L, -1]);
      return mx.put_along_axis(base, idx, sel.logits, -1);
    }
    return this.lmHead ? linear(this.lmHead, normed) : embedAsLinear(this.embedTokens, normed);
  }

  /** Greedy tokens [B, L] (uint32 / int32) of a normed state; the centroid head without full-vocab logits (masked_embedder.argmax). */
  argmax(normed: MlxArray): MlxArray {
    if (!this.masked) {
      using lg = this.logits(normed);
      return mx.argmax(lg, -1);
    }
    using sel = this.#selected(normed);
    const [B, L] = normed.shape as [number, number];
    using best0 = mx.argmax(sel.logits, -1);
    using best = mx.expand_dims(best0, -1);
    using canon = mx.reshape(sel.canonical, [B, L, -1]);
    using pick = mx.take_along_axis(canon, best, -1);
    return mx.squeeze(pick, -1);
  }

  /** MaskedEmbedder._selected_logits: the top-k centroids' tokens and their logits. */
  #selected(h: MlxArray): { canonical: MlxArray; logits: MlxArray } & Disposable {
    const m = this.masked!;
    const K = this.config.centroidTopK;
    const [B, L, H] = h.shape as [number, number, number];
    const vpc = this.config.text.vocabSize / this.config.numCentroids;
    using cl = linear(m.centroids, h);
    using part = mx.argpartition(cl, -K, -1);
    using top = mx.index(part, "...", mx.sl(-K, null));
    const canonical = mx.take(m.ordering, top, 0);
    using flat = mx.reshape(canonical, [-1]);
    using rows = embed(this.embedTokens, flat);
    using emb = mx.reshape(rows, [B, L, K * vpc, H]);
    using embT = mx.swapaxes(emb, -1, -2);
    using hq = mx.expand_dims(h, -2);
    using mm = mx.matmul(hq, embT);
    const logits = mx.squeeze(mm, -2);
    return {
      canonical,
      logits,
      [Symbol.dispose]() {
        canonical.dispose();
        logits.dispose();
      },
    };
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

/** A loaded drafter checkpoint; dispose it to free the weights. */
export interface LoadedAssistant extends Disposable {
  dir: string;
  config: Gemma4AssistantConfig;
  model: Gemma4Assistant;
  dispose(): void;
}

/** Whether `dir/config.json` is a Gemma 4 MTP drafter (model_type "gemma4_assistant"). */
export function isAssistantDir(dir: string): boolean {
  try {
    const j = readJson(join(dir, "config.json"));
    return typeof j === "object" && j !== null && (j as Record<string, unknown>).model_type === "gemma4_assistant";
  } catch {
    return false;
  }
}

/**
 * Load a Gemma 4 MTP drafter: config.json (model_type gemma4_assistant, as HF ships it and as
 * mlx-vlm's split/convert writes it: block_size, quantization) and its safetensors (single file,
 * index, or model*.safetensors). Weights stay lazy until first use.
 */
export function loadAssistant(dir: string): LoadedAssistant {
  const file = join(dir, "config.json");
  const config = parseGemma4AssistantConfig(readJson(file), file);
  const files = findWeights(dir);
  const tensors = loadPickedTensors(files, (n) => n);
  try {
    const model = new Gemma4Assistant(config, tensors, dir);
    const dispose = (): void => {
      model.dispose();
      for (const a of tensors.values()) a.dispose();
    };
    return { dir, config, model, dispose, [Symbol.dispose]: dispose };
  } catch (e) {
    for (const a of tensors.values()) a.dispose();
    throw e;
  }
}
