// Gemma 4 text model, the generic path: every config mlx-lm's gemma4_text.py supports, the same
// ops in the same order and dtypes (docs/gemma4.md), so logits match mlx-lm bit for bit.
import { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { type Cache, createCausalMask, KVCache, type KvView, type Mask, plainCodec, RotatingKVCache } from "@mlx-bun/kv-cache";
import { type Gemma4Config, type LayerSpec, type LayerType, layerSpecs } from "../config.ts";
import { expectedTensors } from "../weights.ts";
import { WeightsError } from "../errors.ts";
import { codecFor, type KvMode } from "./kv-mode.ts";
import { embed, embedAsLinear, linear, type ModuleWeights, moduleWeights, switchLinear } from "./nn.ts";
import { Scope } from "./scope.ts";

interface LayerWeights {
  spec: LayerSpec;
  q: ModuleWeights;
  k?: ModuleWeights;
  v?: ModuleWeights;
  o: ModuleWeights;
  qNorm: MlxArray;
  kNorm?: MlxArray;
  inputNorm: MlxArray;
  postAttnNorm: MlxArray;
  preFfNorm: MlxArray;
  postFfNorm: MlxArray;
  gate: ModuleWeights;
  up: ModuleWeights;
  down: ModuleWeights;
  moe?: {
    proj: ModuleWeights;
    scale: MlxArray;
    perExpertScale: MlxArray;
    gate: ModuleWeights;
    up: ModuleWeights;
    down: ModuleWeights;
    postFf1: MlxArray;
    postFf2: MlxArray;
    preFf2: MlxArray;
  };
  ple?: { gate: ModuleWeights; proj: ModuleWeights; norm: MlxArray };
  layerScalar: MlxArray;
  /** Custom RoPE frequencies (proportional RoPE), shared per layer type. */
  freqs?: MlxArray;
}

/** One forward step's per-layer products shared with KV-sharing layers. */
interface Shared {
  view: KvView;
  offset: MlxArray | number;
}

export class Gemma4Model implements Disposable {
  readonly specs: LayerSpec[];
  readonly firstShared: number;
  #layers: LayerWeights[];
  #embed: ModuleWeights;
  #norm: MlxArray;
  #lmHead: ModuleWeights;
  #ple?: { embed: ModuleWeights; proj: ModuleWeights; norm: MlxArray };
  #owned: MlxArray[] = [];

  constructor(
    readonly config: Gemma4Config,
    tensors: Map<string, MlxArray>,
  ) {
    const t = config.text;
    const info = new Map([...tensors].map(([n, a]) => [n, { shape: [...a.shape], dtype: a.dtype }]));
    const manifest = expectedTensors(config, { actual: info });
    const M = `${config.prefix}model.`;
    const mod = (path: string): ModuleWeights => moduleWeights(tensors, path, manifest.get(`${path}.weight`)?.quant);
    const param = (path: string): MlxArray => {
      const a = tensors.get(path);
      if (!a) throw new WeightsError(`missing tensor ${path}`);
      return a;
    };
    this.specs = layerSpecs(t);
    this.firstShared = t.numHiddenLayers - t.numKvSharedLayers;
    const freqsByType = new Map<LayerType, MlxArray>();
    this.#layers = this.specs.map((s) => {
      const L = `${M}layers.${s.index}.`;
      let freqs: MlxArray | undefined;
      if (s.rope.type === "proportional") {
        freqs = freqsByType.get(s.type);
        if (!freqs) {
          freqs = proportionalFreqs(s.rope.dims, s.rope.rotatedDims, s.rope.theta, s.rope.factor);
          freqsByType.set(s.type, freqs);
          this.#owned.push(freqs);
        }
      }
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
    this.#embed = mod(`${M}embed_tokens`);
    this.#norm = param(`${M}norm.weight`);
    this.#lmHead = t.tieWordEmbeddings ? this.#embed : mod(`${config.prefix}lm_head`);
    if (t.hiddenSizePerLayerInput) {
      this.#ple = {
        embed: mod(`${M}embed_tokens_per_layer`),
        proj: mod(`${M}per_layer_model_projection`),
        norm: param(`${M}per_layer_projection_norm.weight`),
      };
    }
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
    return this.specs.slice(0, this.firstShared).map((s) =>
      s.type === "full_attention"
        ? opts.maxKvSize
          ? new RotatingKVCache(opts.maxKvSize, 0, codec)
          : new KVCache(codec)
        : new RotatingKVCache(t.slidingWindow, 0, slidingCodec),
    );
  }

  /** Logits [B, L, vocab] for token ids [B, L] (int32), appending to `caches` (or none). */
  forward(ids: MlxArray, caches: Cache[] | null = null): MlxArray {
    const t = this.config.text;
    const eps = t.rmsNormEps;
    if (ids.ndim !== 2) throw new WeightsError(`Gemma4Model.forward: ids must be [B, L], got ${ids.describe()}`);
    if (caches && caches.length !== this.firstShared) {
      throw new WeightsError(`Gemma4Model.forward: ${caches.length} caches given, the model needs ${this.firstShared}`);
    }
    const [B, N] = ids.shape as [number, number];
    using s = new Scope();
    const emb = s.t(embed(this.#embed, ids));
    let h = s.t(mx.multiply(emb, t.hiddenSize ** 0.5));

    // Per-layer inputs (gemma4_text.py _get_per_layer_inputs / _project_per_layer_inputs).
    let perLayer: MlxArray | undefined;
    if (this.#ple) {
      const hpl = t.hiddenSizePerLayerInput;
      const pe = s.t(embed(this.#ple.embed, ids));
      const pes = s.t(mx.multiply(pe, hpl ** 0.5));
      const pli = s.t(mx.unflatten(pes, -1, [t.numHiddenLayers, hpl]));
      const proj0 = s.t(linear(this.#ple.proj, h));
      const proj1 = s.t(mx.multiply(proj0, t.hiddenSize ** -0.5));
      const proj2 = s.t(mx.unflatten(proj1, -1, [t.numHiddenLayers, hpl]));
      const proj3 = s.t(mx.fast.rms_norm(proj2, this.#ple.norm, eps));
      const sum = s.t(mx.add(proj3, pli));
      perLayer = s.t(mx.multiply(sum, 2.0 ** -0.5));
    }

    // Masks: one per layer type, from the first cache of that type (before its update).
    const masks = new Map<LayerType, Mask>();
    for (const spec of this.specs) {
      if (masks.has(spec.type)) continue;
      const c = caches && spec.index < this.firstShared ? caches[spec.index]! : null;
      const m = c ? c.makeMask(N, spec.window) : N === 1 ? null : spec.window !== null && N > spec.window ? createCausalMask(N, 0, spec.window) : "causal";
      if (m !== null && m !== "causal") s.t(m);
      masks.set(spec.type, m);
    }

    const shared: (Shared | undefined)[] = new Array(this.specs.length);
    try {
      for (const lw of this.#layers) {
        const spec = lw.spec;
        const cache = caches && spec.index < this.firstShared ? caches[spec.index]! : null;
        const pl = perLayer ? s.t(mx.index(perLayer, ":", ":", spec.index, ":")) : undefined;
        const out = this.#layer(lw, h, masks.get(spec.type)!, cache, pl, spec.hasKv ? undefined : shared[spec.kvSource], B, N, s);
        h = out.h;
        shared[spec.index] = out.shared;
      }
    } finally {
      for (const sh of new Set(shared)) {
        if (!sh) continue;
        sh.view.dispose();
        if (sh.offset instanceof MlxArray) sh.offset.dispose();
      }
    }
    const normed = s.t(mx.fast.rms_norm(h, this.#norm, eps));
    const logits = this.#lmHead === this.#embed ? embedAsLinear(this.#embed, normed) : linear(this.#lmHead, normed);
    if (t.finalLogitSoftcapping === null) return logits;
    const cap = t.finalLogitSoftcapping;
    s.t(logits);
    const scaled = s.t(mx.divide(logits, cap));
    const th = s.t(mx.tanh(scaled));
    return mx.multiply(th, cap);
  }

  #rope(lw: LayerWeights, x: MlxArray, offset: MlxArray | number): MlxArray {
    const r = lw.spec.rope;
    if (lw.freqs) return mx.fast.rope(x, r.dims, { traditional: r.traditional, freqs: lw.freqs, scale: 1, offset });
    return mx.fast.rope(x, r.dims, { traditional: r.traditional, base: r.theta, scale: r.scale, offset });
  }

  #layer(
    lw: LayerWeights,
    x: MlxArray,
    mask: Mask,
    cache: Cache | null,
    perLayerInput: MlxArray | undefined,
    donor: Shared | undefined,
    B: number,
    L: number,
    s: Scope,
  ): { h: MlxArray; shared: Shared } {
    const t = this.config.text;
    const eps = t.rmsNormEps;
    const spec = lw.spec;

    // Attention (gemma4_text.py Attention.__call__).
    const hIn = s.t(mx.fast.rms_norm(x, lw.inputNorm, eps));
    const q0 = s.t(linear(lw.q, hIn));
    const q1 = s.t(mx.reshape(q0, [B, L, spec.numHeads, spec.headDim]));
    const q2 = s.t(mx.fast.rms_norm(q1, lw.qNorm, eps));
    let sharedOut: Shared;
    let offset: MlxArray | number;
    if (donor) {
      if (spec.hasKv) throw new WeightsError(`layer ${spec.index}: a KV-owning layer got shared KV`);
      offset = donor.offset;
      sharedOut = donor;
    } else {
      if (!spec.hasKv) throw new WeightsError(`Layer ${spec.index} is a KV-shared layer but received no shared_kv`);
      const k0 = s.t(linear(lw.k!, hIn));
      const k1 = s.t(mx.reshape(k0, [B, L, spec.numKvHeads, spec.headDim]));
      let v1 = k1;
      if (!spec.kEqV) {
        const v0 = s.t(linear(lw.v!, hIn));
        v1 = s.t(mx.reshape(v0, [B, L, spec.numKvHeads, spec.headDim]));
      }
      offset = cache ? MlxArray.scalar(cache.offset, "int32") : 0;
      const k2 = s.t(mx.fast.rms_norm(k1, lw.kNorm!, eps));
      const k3 = s.t(mx.transpose(k2, [0, 2, 1, 3]));
      const k4 = s.t(this.#rope(lw, k3, offset));
      const v2 = s.t(mx.fast.rms_norm(v1, null, eps));
      const v3 = s.t(mx.transpose(v2, [0, 2, 1, 3]));
      const view = cache ? cache.updateAndFetch(k4, v3) : plainCodec.view([k4.retain(), v3.retain()], L);
      sharedOut = { view, offset };
    }
    const q3 = s.t(mx.transpose(q2, [0, 2, 1, 3]));
    const q4 = s.t(this.#rope(lw, q3, offset));
    const att = s.t(sharedOut.view.attend(q4, 1.0, mask));
    const att1 = s.t(mx.transpose(att, [0, 2, 1, 3]));
    const att2 = s.t(mx.reshape(att1, [B, L, -1]));
    const o = s.t(linear(lw.o, att2));
    const oN = s.t(mx.fast.rms_norm(o, lw.postAttnNorm, eps));
    let h = s.t(mx.add(x, oN));

    // Feed-forward (DecoderLayer.__call__).
    const residual = h;
    let ff: MlxArray;
    if (lw.moe) {
      const m = lw.moe;
      const h1a = s.t(mx.fast.rms_norm(h, lw.preFfNorm, eps));
      const h1b = s.t(this.#mlp(lw, h1a, s));
      const h1 = s.t(mx.fast.rms_norm(h1b, m.postFf1, eps));
      const [idx, w] = this.#router(lw, h, s);
      const h2a = s.t(mx.fast.rms_norm(h, m.preFf2, eps));
      const h2b = s.t(this.#experts(lw, h2a, idx, w, s));
      const h2 = s.t(mx.fast.rms_norm(h2b, m.postFf2, eps));
      ff = s.t(mx.add(h1, h2));
    } else {
      const f0 = s.t(mx.fast.rms_norm(h, lw.preFfNorm, eps));
      ff = s.t(this.#mlp(lw, f0, s));
    }
    const ffN = s.t(mx.fast.rms_norm(ff, lw.postFfNorm, eps));
    h = s.t(mx.add(residual, ffN));

    // Per-layer input gating.
    if (lw.ple && perLayerInput) {
      const g0 = s.t(linear(lw.ple.gate, h));
      const g1 = s.t(mx.gelu_approx(g0));
      const g2 = s.t(mx.multiply(g1, perLayerInput));
      const g3 = s.t(linear(lw.ple.proj, g2));
      const g4 = s.t(mx.fast.rms_norm(g3, lw.ple.norm, eps));
      h = s.t(mx.add(h, g4));
    }
    h = s.t(mx.multiply(h, lw.layerScalar));
    return { h, shared: sharedOut };
  }

  #mlp(lw: LayerWeights, x: MlxArray, s: Scope): MlxArray {
    const g = s.t(linear(lw.gate, x));
    const u = s.t(linear(lw.up, x));
    const act = s.t(mx.gelu_approx(g));
    const prod = s.t(mx.multiply(act, u));
    return linear(lw.down, prod);
  }

  /** Router: norm → scale → project → top-k → softmax → per-expert scale. */
  #router(lw: LayerWeights, x: MlxArray, s: Scope): [MlxArray, MlxArray] {
    const t = this.config.text;
    const m = lw.moe!;
    const k = t.topKExperts!;
    const sc = s.t(mx.multiply(m.scale, t.hiddenSize ** -0.5));
    const xn = s.t(mx.fast.rms_norm(x, sc, t.rmsNormEps));
    const scores = s.t(linear(m.proj, xn));
    const part = s.t(mx.argpartition(scores, -k, -1));
    const idx = s.t(mx.index(part, "...", mx.sl(-k, null)));
    const w0 = s.t(mx.take_along_axis(scores, idx, -1));
    const w1 = s.t(mx.softmax(w0, -1));
    const pes = s.t(mx.index(m.perExpertScale, idx));
    const w = s.t(mx.multiply(w1, pes));
    return [idx, w];
  }

  /** Experts: SwitchGLU with GeGLU, weighted sum over the top-k (switch_layers.py SwitchGLU). */
  #experts(lw: LayerWeights, x: MlxArray, indices: MlxArray, weights: MlxArray, s: Scope): MlxArray {
    const m = lw.moe!;
    const we = s.t(mx.expand_dims(weights, -1));
    let xe = s.t(mx.expand_dims(x, [-2, -3]));
    const doSort = indices.size >= 64;
    let idx = indices;
    let inv: MlxArray | undefined;
    if (doSort) {
      const M = indices.shape[indices.ndim - 1]!;
      const flat = s.t(mx.flatten(indices));
      const order = s.t(mx.argsort(flat));
      inv = s.t(mx.argsort(order));
      const rows = s.t(mx.floor_divide(order, M));
      const xf = s.t(mx.flatten(xe, 0, -3));
      xe = s.t(mx.index(xf, rows));
      idx = s.t(mx.index(flat, order));
    }
    const up = s.t(switchLinear(m.up, xe, idx, doSort));
    const gate = s.t(switchLinear(m.gate, xe, idx, doSort));
    const act = s.t(mx.gelu_approx(gate));
    const glu = s.t(mx.multiply(act, up));
    let y = s.t(switchLinear(m.down, glu, idx, doSort));
    if (doSort) {
      const un = s.t(mx.index(y, inv!));
      y = s.t(mx.unflatten(un, 0, [...indices.shape]));
    }
    const ys = s.t(mx.squeeze(y, -2));
    const wy = s.t(mx.multiply(we, ys));
    return mx.sum(wy, -2);
  }

  dispose(): void {
    for (const a of this.#owned) a.dispose();
    this.#owned = [];
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}

/** ProportionalRoPE's frequencies (rope_utils.py:214-220), same ops. */
function proportionalFreqs(dims: number, rotated: number, base: number, factor: number): MlxArray {
  using ar = mx.arange(0, rotated, 2, { dtype: "float32" });
  using exps = mx.divide(ar, dims);
  using pw = mx.power(base, exps);
  using f = mx.multiply(factor, pw);
  using inf = mx.full([(dims - rotated) >> 1], Number.POSITIVE_INFINITY);
  return mx.concatenate([f, inf], 0);
}
