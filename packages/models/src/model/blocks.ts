// The building blocks of the Gemma 4 forward pass (gemma4_text.py), which Gemma4Model.forward
// (gemma4.ts) picks per layer from its spec at run time. Same ops, same order as mlx-lm (decode's
// q/k/v and gate/up: one quantized matmul each group, same bits; fused-linear.ts).
import { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { type Cache, createCausalMask, type KvView, type Mask, plainCodec } from "@mlx-bun/kv-cache";
import type { LayerSpec } from "../config.ts";
import { WeightsError } from "../errors.ts";
import { geglu, logitSoftcap } from "./compiled.ts";
import { type FusedLinear, fusedGeglu, fusedLinear, linearParts } from "./fused-linear.ts";
import { embed, embedAsLinear, linear, type ModuleWeights, switchLinear } from "./nn.ts";
import type { Scalars } from "./scalars.ts";
import { Scope } from "./scope.ts";

export interface LayerWeights {
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
    /** Tensor parallel: each rank holds a slice of every expert's columns; sums the partial outputs. */
    reduce?: (partial: MlxArray) => MlxArray;
  };
  ple?: { gate: ModuleWeights; proj: ModuleWeights; norm: MlxArray };
  layerScalar: MlxArray;
  /** Custom RoPE frequencies (proportional RoPE), shared per layer type. */
  freqs?: MlxArray;
  /** q/k(/v) and gate/up fused along their output rows for single-row (decode) inputs. */
  fused?: { qkv?: FusedLinear; gateUp?: FusedLinear };
}

/** Whole-model weights. */
export interface ModelParts {
  layers: LayerWeights[];
  embed: ModuleWeights;
  norm: MlxArray;
  lmHead: ModuleWeights;
  tied: boolean;
  ple?: { embed: ModuleWeights; proj: ModuleWeights; norm: MlxArray };
}

/** Constants of the model the blocks need. */
export interface ModelConsts {
  hiddenSize: number;
  numLayers: number;
  eps: number;
  hiddenPerLayer: number;
  softcap: number | null;
  topK: number;
  /** The fixed scalar operands, made once (scalars.ts). */
  scalars: Scalars;
}

/**
 * A layer's input `h` and its input norm `n` (rms_norm(h, inputNorm)): the residual point before a
 * block computes both, so that with exact norms on CUDA they come from one launch (residual()).
 */
export interface Hidden {
  h: MlxArray;
  n: MlxArray;
}

/** The first layer's input `h` with its input norm, as the layer loop carries it. */
export function firstHidden(h: MlxArray, layers: readonly LayerWeights[], eps: number, s: Scope): Hidden {
  return { h, n: s.t(mx.fast.rms_norm(h, layers[0]!.inputNorm, eps)) };
}

/** The norm layer `i`'s end takes with its residual: the next layer's input norm, or `final` after the last. */
export function nextNorm(layers: readonly LayerWeights[], i: number, final: MlxArray): MlxArray {
  return i + 1 < layers.length ? layers[i + 1]!.inputNorm : final;
}

/** A KV-owning layer's products that its KV-sharing layers reuse. */
export interface Shared {
  view: KvView;
  offset: MlxArray | number;
}

/**
 * Inputs given as embeddings (images: mlx-vlm's get_input_embeddings): `h` [B, L, hidden] already
 * scaled, with soft tokens in place; `pleIds` the ids for the per-layer embeddings (media tokens → 0).
 */
export interface EmbeddedInputs {
  h: MlxArray;
  pleIds: MlxArray;
}

/** Embeddings × √hidden and, with per-layer embeddings, the per-layer inputs [B, L, layers, hpl]. */
export function embedInputs(m: ModelParts, c: ModelConsts, ids: MlxArray, s: Scope, given?: EmbeddedInputs): { h: MlxArray; perLayer: MlxArray | undefined } {
  const k = c.scalars;
  const scaled = (e: MlxArray): MlxArray => s.t(mx.multiply(e, k.like(c.hiddenSize ** 0.5, e)));
  const h = given ? given.h : scaled(s.t(embed(m.embed, ids)));
  if (!m.ple) return { h, perLayer: undefined };
  const hpl = c.hiddenPerLayer;
  const pe = s.t(embed(m.ple.embed, given ? given.pleIds : ids));
  const pes = s.t(mx.multiply(pe, k.like(hpl ** 0.5, pe)));
  const pli = s.t(mx.unflatten(pes, -1, [c.numLayers, hpl]));
  const proj0 = s.t(linear(m.ple.proj, h));
  const proj1 = s.t(mx.multiply(proj0, k.like(c.hiddenSize ** -0.5, proj0)));
  const proj2 = s.t(mx.unflatten(proj1, -1, [c.numLayers, hpl]));
  const proj3 = s.t(mx.fast.rms_norm(proj2, m.ple.norm, c.eps));
  const sum = s.t(mx.add(proj3, pli));
  return { h, perLayer: s.t(mx.multiply(sum, k.like(2.0 ** -0.5, sum))) };
}

/** The per-layer input of layer i: perLayer[:, :, i, :]. */
export function perLayerInput(perLayer: MlxArray, i: number, s: Scope): MlxArray {
  return s.t(mx.index(perLayer, ":", ":", i, ":"));
}

/** The mask of a layer type, from the first cache of that type before its update (gemma4_text.py _make_masks). */
export function layerMask(cache: Cache | null, n: number, window: number | null, s: Scope): Mask {
  const m = cache ? cache.makeMask(n, window) : n === 1 ? null : window !== null && n > window ? createCausalMask(n, 0, window) : "causal";
  if (m !== null && m !== "causal") s.t(m);
  return m;
}

function rope(lw: LayerWeights, x: MlxArray, offset: MlxArray | number): MlxArray {
  const r = lw.spec.rope;
  if (lw.freqs) return mx.fast.rope(x, r.dims, { traditional: r.traditional, freqs: lw.freqs, scale: 1, offset });
  return mx.fast.rope(x, r.dims, { traditional: r.traditional, base: r.theta, scale: r.scale, offset });
}

function queries(lw: LayerWeights, q0: MlxArray, B: number, L: number, eps: number, s: Scope): MlxArray {
  const spec = lw.spec;
  const q1 = s.t(mx.reshape(q0, [B, L, spec.numHeads, spec.headDim]));
  return s.t(mx.fast.rms_norm(q1, lw.qNorm, eps));
}

/**
 * The residual point `h + rms_norm(y, post)` (times `scale`, Gemma's layer scalar, where given)
 * and, with `next`, that sum's norm by `next` (the next block's input norm). MLX's ops in that
 * order; on CUDA with exact norms on (MLX_BUN_EXACT_NORMS, by default on sm90), one launch of a
 * kernel that keeps their bits (packages/mlx-ops/src/kernels/norm-exact.ts).
 */
export function residual(h: MlxArray, y: MlxArray, post: MlxArray, eps: number, s: Scope, scale?: MlxArray): MlxArray;
export function residual(h: MlxArray, y: MlxArray, post: MlxArray, eps: number, s: Scope, scale: MlxArray | undefined, next: MlxArray): Hidden;
export function residual(h: MlxArray, y: MlxArray, post: MlxArray, eps: number, s: Scope, scale?: MlxArray, next?: MlxArray): MlxArray | Hidden {
  if (mx.kernels.exact_norms_enabled()) {
    if (next && mx.kernels.residual_norm_fits(h, y, post, next, scale ?? null)) {
      const [hOut, n] = mx.kernels.residual_norm_exact(h, y, post, next, scale ?? null, eps);
      return { h: s.t(hOut), n: s.t(n) };
    }
    if (!next && mx.kernels.residual_fits(h, y, post, scale ?? null)) return s.t(mx.kernels.residual_exact(h, y, post, scale ?? null, eps));
  }
  const yN = s.t(mx.fast.rms_norm(y, post, eps));
  const sum = s.t(mx.add(h, yN));
  const out = scale ? s.t(mx.multiply(sum, scale)) : sum;
  return next ? { h: out, n: s.t(mx.fast.rms_norm(out, next, eps)) } : out;
}

/** q [B, L, heads, dim] after its norm → [B, heads, L, dim] rotated at `offset`. */
function rotateQueries(lw: LayerWeights, q2: MlxArray, offset: MlxArray | number, s: Scope): MlxArray {
  const q3 = s.t(mx.transpose(q2, [0, 2, 1, 3]));
  return s.t(rope(lw, q3, offset));
}

function attendAndProject(lw: LayerWeights, x: MlxArray, q4: MlxArray, shared: Shared, mask: Mask, B: number, L: number, eps: number, s: Scope): Hidden {
  const att = s.t(shared.view.attend(q4, 1.0, mask));
  const att1 = s.t(mx.transpose(att, [0, 2, 1, 3]));
  const att2 = s.t(mx.reshape(att1, [B, L, -1]));
  const o = s.t(linear(lw.o, att2));
  // The feed-forward's input norm is taken here, with the residual (one launch with exact norms).
  return residual(x, o, lw.postAttnNorm, eps, s, undefined, lw.preFfNorm);
}

/**
 * The RoPE arguments of the exact heads kernels (norm-exact.ts) for layer `lw` at `offset`, or null
 * where they do not apply: exact norms off, or not one position given as an array, or traditional
 * RoPE (the kernels rotate the other way only). rope(): freqs rotate at scale 1, a base at the config's.
 */
function exactRope(lw: LayerWeights, offset: MlxArray | number): { rope: mx.kernels.QkvHeads["rope"]; at: { offset: MlxArray; freqs?: MlxArray } } | null {
  const r = lw.spec.rope;
  if (!mx.kernels.exact_norms_enabled() || !(offset instanceof MlxArray) || r.traditional) return null;
  const rope = lw.freqs ? { dims: r.dims, base: null, scale: 1 } : { dims: r.dims, base: r.theta, scale: r.scale };
  return { rope, at: { offset, ...(lw.freqs ? { freqs: lw.freqs } : {}) } };
}

/**
 * q and k after their norms and RoPE at `offset`, and v after its norm, each [B, heads, L, head_dim]:
 * with exact norms on CUDA and a fused q/k/v matmul (one position), its output through one launch;
 * else each part reshaped, normed, transposed and rotated by MLX's ops.
 */
function queriesKeysValues(
  lw: LayerWeights,
  hIn: MlxArray,
  offset: MlxArray | number,
  B: number,
  L: number,
  eps: number,
  s: Scope,
): [MlxArray, MlxArray, MlxArray] {
  const spec = lw.spec;
  const parts = lw.v ? [lw.q, lw.k!, lw.v] : [lw.q, lw.k!];
  const D = spec.headDim;
  const ex = exactRope(lw, offset);
  if (ex) {
    const y = fusedLinear(lw.fused?.qkv, parts, hIn);
    if (y) {
      s.t(y);
      const heads = { hq: spec.numHeads, hk: spec.numKvHeads, hv: lw.v ? spec.numKvHeads : 0, dim: D, eps, rope: ex.rope };
      if (mx.kernels.qkv_norm_fits(y, lw.qNorm, lw.kNorm!, heads, ex.at)) {
        const [q, k, v] = mx.kernels.qkv_norm_exact(y, lw.qNorm, lw.kNorm!, heads, ex.at);
        return [s.t(q), s.t(k), s.t(v)];
      }
    }
  }
  const [q0, k0, v0] = linearParts(lw.fused?.qkv, parts, hIn).map((a) => s.t(a));
  const q4 = rotateQueries(lw, queries(lw, q0!, B, L, eps, s), offset, s);
  const k1 = s.t(mx.reshape(k0!, [B, L, spec.numKvHeads, D]));
  const v1 = v0 ? s.t(mx.reshape(v0, [B, L, spec.numKvHeads, D])) : k1;
  const k2 = s.t(mx.fast.rms_norm(k1, lw.kNorm!, eps));
  const k3 = s.t(mx.transpose(k2, [0, 2, 1, 3]));
  const k4 = s.t(rope(lw, k3, offset));
  const v2 = s.t(mx.fast.rms_norm(v1, null, eps));
  const v3 = s.t(mx.transpose(v2, [0, 2, 1, 3]));
  return [q4, k4, v3];
}

/**
 * The RoPE position of a cache's next token as mlx-lm passes it: mx.array(cache.offset), or a
 * batch's per-row positions as int32 [B]; tracked by `s`. `made` keeps one array per value for the
 * whole forward: a step's caches share their positions, so every layer reads one array instead of
 * each making (and writing from the host) its own. The same values as input: the same bits.
 */
function cachePosition(cache: Cache, made: Map<string, MlxArray>, s: Scope): MlxArray {
  const rows = cache.positions?.();
  const key = rows ? `rows:${rows.join(",")}` : `scalar:${cache.offset}`;
  let p = made.get(key);
  if (!p) made.set(key, (p = s.t(rows ? MlxArray.fromNumbers([...rows], [rows.length], "int32") : MlxArray.scalar(cache.offset, "int32"))));
  return p;
}

/** Attention of a KV-owning layer: computes K/V, appends to its cache, attends. Returns h after the residual. */
export function attentionOwn(
  lw: LayerWeights,
  x: Hidden,
  mask: Mask,
  cache: Cache | null,
  positions: Map<string, MlxArray>,
  B: number,
  L: number,
  eps: number,
  s: Scope,
): { h: Hidden; shared: Shared } {
  const offset = cache ? cachePosition(cache, positions, s) : 0;
  const [q4, k4, v3] = queriesKeysValues(lw, x.n, offset, B, L, eps, s);
  const view = cache ? cache.updateAndFetch(k4, v3) : plainCodec.view([k4.retain(), v3.retain()], L);
  const shared = { view, offset };
  return { h: attendAndProject(lw, x.h, q4, shared, mask, B, L, eps, s), shared };
}

/** Attention of a KV-sharing layer: its own queries over the donor layer's view and positions. */
export function attentionShared(lw: LayerWeights, x: Hidden, mask: Mask, donor: Shared | undefined, B: number, L: number, eps: number, s: Scope): Hidden {
  if (!donor) throw new WeightsError(`Layer ${lw.spec.index} is a KV-shared layer but received no shared_kv`);
  const q0 = s.t(linear(lw.q, x.n));
  // With exact norms on CUDA, the norm and RoPE in one launch (as a KV-owning layer's q/k/v).
  const ex = exactRope(lw, donor.offset);
  const heads = ex && { hq: lw.spec.numHeads, dim: lw.spec.headDim, eps, rope: ex.rope };
  const q4 =
    heads && mx.kernels.q_norm_fits(q0, lw.qNorm, heads, ex.at)
      ? s.t(mx.kernels.q_norm_exact(q0, lw.qNorm, heads, ex.at))
      : rotateQueries(lw, queries(lw, q0, B, L, eps, s), donor.offset, s);
  return attendAndProject(lw, x.h, q4, donor, mask, B, L, eps, s);
}

function mlp(lw: LayerWeights, x: MlxArray, s: Scope): MlxArray {
  // The gate/up matvec and mlx-lm's geglu in one launch where it is on (MLX_BUN_QMV_GEGLU).
  const glu = fusedGeglu(lw.fused?.gateUp, [lw.gate, lw.up], x);
  if (glu) return linear(lw.down, s.t(glu));
  const [g, u] = linearParts(lw.fused?.gateUp, [lw.gate, lw.up], x).map((a) => s.t(a));
  const prod = s.t(geglu(g!, u!));
  return linear(lw.down, prod);
}

/** The dense feed-forward's output before its post-norm, from `x.n` (rms_norm(h, preFfNorm)); layerEnd adds it. */
export function feedForwardDense(lw: LayerWeights, x: Hidden, s: Scope): MlxArray {
  return s.t(mlp(lw, x.n, s));
}

/** Dense MLP plus routed experts (the MoE block), before the post-norm; `x.n` is rms_norm(h, preFfNorm). */
export function feedForwardMoe(lw: LayerWeights, x: Hidden, c: ModelConsts, s: Scope): MlxArray {
  const m = lw.moe!;
  const eps = c.eps;
  const h1b = s.t(mlp(lw, x.n, s));
  const h1 = s.t(mx.fast.rms_norm(h1b, m.postFf1, eps));
  const [idx, w] = router(lw, x.h, c, s);
  const h2a = s.t(mx.fast.rms_norm(x.h, m.preFf2, eps));
  const h2b = s.t(experts(lw, h2a, idx, w, s));
  const h2 = s.t(mx.fast.rms_norm(h2b, m.postFf2, eps));
  return s.t(mx.add(h1, h2));
}

/**
 * The end of a layer after its feed-forward output `ff`: the post-norm and residual, the per-layer
 * input gate where the model has one (2B/4B), the layer scalar, and `next`'s norm of the result
 * (the next layer's input norm, or the final norm after the last layer).
 */
export function layerEnd(lw: LayerWeights, h: MlxArray, ff: MlxArray, perLayer: MlxArray | undefined, next: MlxArray, eps: number, s: Scope): Hidden {
  if (!lw.ple || !perLayer) return residual(h, ff, lw.postFfNorm, eps, s, lw.layerScalar, next);
  const h1 = residual(h, ff, lw.postFfNorm, eps, s);
  const p = lw.ple;
  const g0 = s.t(linear(p.gate, h1));
  // Two ops, as mlx-lm: compiled together (geglu) they differ on CUDA (docs/benchmarks.md).
  const g2 = s.t(mx.multiply(s.t(mx.gelu_approx(g0)), perLayer));
  const g3 = s.t(linear(p.proj, g2));
  return residual(h1, g3, p.norm, eps, s, lw.layerScalar, next);
}

/** Router: norm → scale → project → top-k → softmax → per-expert scale. */
function router(lw: LayerWeights, x: MlxArray, c: ModelConsts, s: Scope): [MlxArray, MlxArray] {
  const m = lw.moe!;
  const k = c.topK;
  const sc = s.t(mx.multiply(m.scale, c.scalars.like(c.hiddenSize ** -0.5, m.scale)));
  const xn = s.t(mx.fast.rms_norm(x, sc, c.eps));
  const scores = s.t(linear(m.proj, xn));
  const part = s.t(mx.argpartition(scores, -k, -1));
  const idx = s.t(mx.stop_gradient(s.t(mx.index(part, "...", mx.sl(-k, null)))));
  const w0 = s.t(mx.take_along_axis(scores, idx, -1));
  const w1 = s.t(mx.softmax(w0, -1));
  const pes = s.t(mx.index(m.perExpertScale, idx));
  const w = s.t(mx.multiply(w1, pes));
  return [idx, w];
}

/** Experts: SwitchGLU with GeGLU, weighted sum over the top-k (switch_layers.py SwitchGLU). */
function experts(lw: LayerWeights, x: MlxArray, routed: MlxArray, weights: MlxArray, s: Scope): MlxArray {
  const m = lw.moe!;
  const indices = s.t(mx.stop_gradient(routed));
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
  const glu = s.t(geglu(gate, up));
  let y = s.t(switchLinear(m.down, glu, idx, doSort));
  if (doSort) {
    const un = s.t(mx.index(y, inv!));
    y = s.t(mx.unflatten(un, 0, [...indices.shape]));
  }
  const ys = s.t(mx.squeeze(y, -2));
  const wy = s.t(mx.multiply(we, ys));
  if (!m.reduce) return mx.sum(wy, -2);
  return m.reduce(s.t(mx.sum(wy, -2)));
}

/** Output head (tied: the embedding as a linear) and soft-capping of the final-normed state. The caller owns the logits. */
export function finalLogits(m: ModelParts, c: ModelConsts, normed: MlxArray, s: Scope): MlxArray {
  const logits = m.tied ? embedAsLinear(m.embed, normed) : linear(m.lmHead, normed);
  if (c.softcap === null) return logits;
  s.t(logits);
  return logitSoftcap(c.softcap, logits);
}

/** Free the per-step shared views. */
export function releaseShared(shared: readonly (Shared | undefined)[]): void {
  // Views only: the offsets belong to the forward's scope (cachePosition).
  for (const sh of new Set(shared)) sh?.view.dispose();
}
