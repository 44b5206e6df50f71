// Logits processors and samplers, as mlx-lm's sample_utils.py: logit bias, repetition /
// presence / frequency penalties over a context window, then top-p, min-p, XTC, top-k on the
// log-probabilities, then categorical sampling at the temperature (greedy when 0).
import { MlxArray, MlxError } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import type { LogitsProcessor, SamplingParams } from "./types.ts";

/** Settings with defaults applied and checked. */
export interface ResolvedSampling {
  temperature: number;
  topP: number;
  topK: number;
  minP: number;
  /** Tokens min-p never removes (the most likely ones; mlx-lm's min_tokens_to_keep, default 1). */
  minTokensToKeep: number;
  repetitionPenalty: number;
  presencePenalty: number;
  frequencyPenalty: number;
  penaltyContext: number;
  logitBias: [number, number][];
  /** XTC: probability per token (0 = off), threshold, and the ids it never removes. */
  xtcProbability: number;
  xtcThreshold: number;
  xtcSpecialTokens: number[];
  seed: number | undefined;
  /** Keys the seed's stream skips before the first draw. */
  seedSkip: number;
}

/**
 * Apply defaults and validate; errors name the field. `xtcSpecialTokens`: the ids XTC never
 * removes (see xtcSpecialTokens(); ids outside the vocabulary are dropped).
 */
export function resolveSampling(p: SamplingParams = {}, vocabSize: number, xtcSpecialTokens: readonly number[] = []): ResolvedSampling {
  const num = (name: string, v: number | undefined, def: number, ok: (x: number) => boolean, rule: string): number => {
    if (v === undefined) return def;
    if (typeof v !== "number" || !Number.isFinite(v) || !ok(v)) throw new MlxError(`${name} must be ${rule}, got ${JSON.stringify(v)}`);
    return v;
  };
  const logitBias: [number, number][] = [];
  for (const [k, v] of Object.entries(p.logitBias ?? {})) {
    const id = Number(k);
    if (!Number.isInteger(id) || id < 0 || id >= vocabSize) throw new MlxError(`logit_bias: token id ${k} is outside the vocabulary (0..${vocabSize - 1})`);
    if (typeof v !== "number" || !Number.isFinite(v)) throw new MlxError(`logit_bias[${k}] must be a finite number`);
    logitBias.push([id, v]);
  }
  const seed = p.seed;
  if (seed !== undefined && !Number.isInteger(seed)) throw new MlxError(`seed must be an integer, got ${JSON.stringify(seed)}`);
  // The PRNG key takes a uint64 seed (mx.random.key); here a safe integer, checked before any step runs.
  if (seed !== undefined && (seed < 0 || !Number.isSafeInteger(seed)))
    throw new MlxError(`seed must be an integer in 0..${Number.MAX_SAFE_INTEGER}, got ${seed}`);
  return {
    temperature: num("temperature", p.temperature, 0, (x) => x >= 0, ">= 0"),
    // 0 turns top-p off, as 1 does (mlx-lm applies it for 0 < top_p < 1 only).
    topP: num("top_p", p.topP, 1, (x) => x >= 0 && x <= 1, "in [0, 1]"),
    topK: num("top_k", p.topK, 0, (x) => Number.isInteger(x) && x >= 0, "a non-negative integer"),
    minP: num("min_p", p.minP, 0, (x) => x >= 0 && x <= 1, "in [0, 1]"),
    minTokensToKeep: num("min_tokens_to_keep", p.minTokensToKeep, 1, (x) => Number.isInteger(x) && x >= 1, "a positive integer"),
    repetitionPenalty: num("repetition_penalty", p.repetitionPenalty, 1, (x) => x > 0, "> 0"),
    presencePenalty: num("presence_penalty", p.presencePenalty, 0, () => true, "a number"),
    frequencyPenalty: num("frequency_penalty", p.frequencyPenalty, 0, () => true, "a number"),
    // 0 is the whole history, as in mlx-lm (whose processors take tokens[-0:], i.e. all of them).
    penaltyContext: num("repetition_context_size", p.penaltyContext, 20, (x) => Number.isInteger(x) && x >= 0, "a non-negative integer"),
    logitBias,
    // Ranges of mlx-lm's apply_xtc (mlx_lm.server lets a threshold up to 1 through, then apply_xtc raises).
    xtcProbability: num("xtc_probability", p.xtcProbability, 0, (x) => x >= 0 && x <= 1, "in [0, 1]"),
    xtcThreshold: num("xtc_threshold", p.xtcThreshold, 0.1, (x) => x >= 0 && x <= 0.5, "in [0, 0.5]"),
    xtcSpecialTokens: [...new Set(xtcSpecialTokens)].filter((t) => Number.isInteger(t) && t >= 0 && t < vocabSize),
    seed,
    seedSkip: num("seed_skip", p.seedSkip, 0, (x) => Number.isInteger(x) && x >= 0, "a non-negative integer"),
  };
}

/**
 * The ids XTC never removes, as mlx_lm.generate and mlx_lm.server pass them:
 * `tokenizer.encode("\n")` (with the tokenizer's special tokens, e.g. BOS) and the eos ids.
 */
export function xtcSpecialTokens(tokenizer: { encode(text: string): number[]; eosTokenIds: Iterable<number> }): number[] {
  return [...tokenizer.encode("\n"), ...tokenizer.eosTokenIds];
}

/** logits[:, ids] = fn(logits[:, ids]) for distinct ids, on a [1, V] row. */
function updateColumns(logits: MlxArray, ids: number[], fn: (sel: MlxArray) => MlxArray): MlxArray {
  using idx = MlxArray.fromNumbers(ids, [1, ids.length], "int32");
  using sel = mx.take_along_axis(logits, idx, -1);
  using upd = fn(sel);
  return mx.put_along_axis(logits, idx, upd, -1);
}

/** Run `processors` in order over one [1, V] row (`logits` borrowed; the result is the caller's). */
export function applyProcessors(logits: MlxArray, history: readonly number[], processors: readonly LogitsProcessor[]): MlxArray {
  let out = logits.retain();
  for (const p of processors) {
    const next = p.process(history, out);
    out.dispose();
    out = next;
  }
  return out;
}

/** The logits processors the sampling settings ask for, in mlx-lm's order: logit bias, then the penalties. */
export function samplingProcessors(s: ResolvedSampling): LogitsProcessor[] {
  const out: LogitsProcessor[] = [];
  if (s.logitBias.length) out.push(logitBiasProcessor(s.logitBias));
  if (s.repetitionPenalty !== 1 || s.presencePenalty !== 0 || s.frequencyPenalty !== 0) out.push(penaltyProcessor(s));
  return out;
}

/** The logits processors of mlx-lm, in its order, for one [1, V] row. `history` is prompt + generated ids. */
export function processLogits(logits: MlxArray, history: readonly number[], s: ResolvedSampling): MlxArray {
  return applyProcessors(logits, history, samplingProcessors(s));
}

function logitBiasProcessor(bias: readonly [number, number][]): LogitsProcessor {
  const ids = bias.map(([i]) => i);
  const values = bias.map(([, v]) => v);
  return {
    readsHistory: false,
    process(_history, logits) {
      using vals = MlxArray.fromNumbers(values, [1, ids.length], "float32");
      return updateColumns(logits, ids, (sel) => {
        using v = mx.astype(vals, sel.dtype);
        return mx.add(sel, v);
      });
    },
  };
}

/** Repetition, presence and frequency penalties over the last `penaltyContext` ids (mlx-lm's make_logits_processors). */
function penaltyProcessor(s: ResolvedSampling): LogitsProcessor {
  return {
    readsHistory: true,
    process(history, logits) {
      let out = logits.retain();
      const step = (next: MlxArray): void => {
        out.dispose();
        out = next;
      };
      const window = history.slice(-s.penaltyContext);
      if (!window.length) return out;
      const counts = new Map<number, number>();
      for (const t of window) counts.set(t, (counts.get(t) ?? 0) + 1);
      const uniq = [...counts.keys()];
      if (s.repetitionPenalty !== 1) {
        const p = s.repetitionPenalty;
        step(
          updateColumns(out, uniq, (sel) => {
            using neg = mx.less(sel, 0);
            using mul = mx.multiply(sel, p);
            using div = mx.divide(sel, p);
            return mx.where(neg, mul, div);
          }),
        );
      }
      if (s.presencePenalty !== 0) step(updateColumns(out, uniq, (sel) => mx.subtract(sel, s.presencePenalty)));
      if (s.frequencyPenalty !== 0) {
        // mlx-lm subtracts once per occurrence (scatter-subtract): k passes, not one multiple of p.
        const maxCount = Math.max(...counts.values());
        for (let k = 1; k <= maxCount; k++) {
          const ids = uniq.filter((t) => counts.get(t)! >= k);
          step(updateColumns(out, ids, (sel) => mx.subtract(sel, s.frequencyPenalty)));
        }
      }
      return out;
    },
  };
}

/** logprobs = logits - logsumexp(logits) (mlx-lm's generate_step). */
export function logSoftmax(logits: MlxArray): MlxArray {
  using lse = mx.logsumexp(logits, -1, { keepdims: true });
  return mx.subtract(logits, lse);
}

function applyTopP(lp: MlxArray, topP: number): MlxArray {
  using sorted = mx.sort(lp, -1);
  using sorted32 = mx.astype(sorted, "float32");
  using probs = mx.exp(sorted32);
  using above = mx.cumsum(probs, -1, { reverse: true, inclusive: false });
  using a0 = mx.index(above, "...", mx.sl(null, 1));
  using p0 = mx.index(probs, "...", mx.sl(null, 1));
  using total = mx.add(a0, p0);
  using thr = mx.multiply(total, topP);
  using ge = mx.greater_equal(above, thr);
  using dropped = mx.sum(ge, -1, { keepdims: true });
  using threshold = mx.take_along_axis(sorted, dropped, -1);
  using below = mx.less(lp, threshold);
  return mx.where(below, Number.NEGATIVE_INFINITY, lp);
}

function applyMinP(lp: MlxArray, minP: number, minTokensToKeep: number): MlxArray {
  using top = mx.max(lp, -1, { keepdims: true });
  using scaled = mx.add(top, Math.log(minP));
  let remove = mx.less(lp, scaled);
  // mlx-lm's apply_min_p: the min_tokens_to_keep most likely tokens are never removed.
  const vocab = lp.shape[lp.ndim - 1]!;
  if (minTokensToKeep > 1) {
    const k = Math.min(minTokensToKeep, vocab);
    using part = mx.argpartition(lp, vocab - k, -1);
    using topIdx = mx.index(part, "...", mx.sl(vocab - k, null));
    using all = remove;
    remove = mx.put_along_axis(all, topIdx, false, -1);
  }
  using r = remove;
  return mx.where(r, Number.NEGATIVE_INFINITY, lp);
}

function applyTopK(lp: MlxArray, topK: number): MlxArray {
  const vocab = lp.shape[lp.ndim - 1]!;
  if (topK >= vocab) return lp.retain();
  using neg = mx.negative(lp);
  using part = mx.argpartition(neg, topK - 1, -1);
  using maskIdx = mx.index(part, "...", mx.sl(topK, null));
  using ninf = MlxArray.scalar(Number.NEGATIVE_INFINITY, lp.dtype);
  return mx.put_along_axis(lp, maskIdx, ninf, -1);
}

/**
 * XTC (mlx-lm's apply_xtc) on log-probabilities [B, V]: the tokens above `xtcThreshold` except
 * the least likely of them go to -inf, the special tokens never; `coin` [] uniform in [0, 1)
 * decides (coin > xtcProbability: unchanged); without a coin the removal always happens.
 */
function applyXtc(lp: MlxArray, s: ResolvedSampling, coin: MlxArray | undefined): MlxArray {
  using probs = mx.softmax(lp, -1);
  using above = mx.greater(probs, s.xtcThreshold);
  using candidates = mx.where(above, probs, Number.POSITIVE_INFINITY);
  using least = mx.min(candidates, -1, { keepdims: true });
  let mask = mx.greater(probs, least);
  if (s.xtcSpecialTokens.length) {
    const rows = lp.ndim > 1 ? lp.shape.slice(0, -1) : [];
    using ids = MlxArray.fromNumbers(s.xtcSpecialTokens, [...rows.map(() => 1), s.xtcSpecialTokens.length], "int32");
    using idx = rows.some((r) => r !== 1) ? mx.broadcast_to(ids, [...rows, s.xtcSpecialTokens.length]) : ids.retain();
    using keepAll = mask;
    mask = mx.put_along_axis(keepAll, idx, false, -1);
  }
  using m = mask;
  if (!coin) return mx.where(m, Number.NEGATIVE_INFINITY, lp);
  using removed = mx.where(m, Number.NEGATIVE_INFINITY, lp);
  using skip = mx.greater(coin, s.xtcProbability);
  return mx.where(skip, lp, removed);
}

/** top-p, min-p, XTC (with `coin`, or always when "always"; skipped when undefined), top-k: mlx-lm's make_sampler chain. */
function filtered(lp: MlxArray, s: ResolvedSampling, xtc: MlxArray | "always" | undefined): MlxArray {
  let x = lp.retain();
  const step = (next: MlxArray): void => {
    x.dispose();
    x = next;
  };
  if (s.topP > 0 && s.topP < 1) step(applyTopP(x, s.topP));
  if (s.minP !== 0) step(applyMinP(x, s.minP, s.minTokensToKeep));
  if (xtc !== undefined) step(applyXtc(x, s, xtc === "always" ? undefined : xtc));
  if (s.topK > 0) step(applyTopK(x, s.topK));
  return x;
}

/** The next key: from a stream, or a given key (split in two when XTC also needs one). */
function keysFor(keys: KeyStream | MlxArray | undefined, xtc: boolean): [MlxArray | undefined, MlxArray | undefined] {
  if (keys instanceof KeyStream) {
    // mlx-lm's sampler draws XTC's coin before the categorical draw, from the same random state.
    const coin = xtc ? keys.next() : undefined;
    return [coin, keys.next()];
  }
  if (keys && xtc) {
    using both = mx.random.split(keys);
    return [mx.index(both, 0), mx.index(both, 1)];
  }
  return [undefined, keys?.retain()];
}

/**
 * The sampled token ids [B] from log-probabilities [B, V]: argmax at temperature 0, else mlx-lm's
 * make_sampler: top-p, min-p, XTC, top-k, then categorical(logprobs / T). `keys`: a request's key
 * stream (XTC's coin, then the categorical draw, as mlx-lm's sampler takes them from MLX's global
 * random state), one key (split in two when XTC is on), or undefined for MLX's global state.
 */
export function sample(lp: MlxArray, s: ResolvedSampling, keys: KeyStream | MlxArray | undefined): MlxArray {
  if (s.temperature === 0) return mx.argmax(lp, -1);
  const xtc = s.xtcProbability > 0;
  const [coinKey, drawKey] = keysFor(keys, xtc);
  try {
    using coin = xtc ? mx.random.uniform(0, 1, [], coinKey ? { key: coinKey } : {}) : undefined;
    using x = filtered(lp, s, coin);
    using scaled = mx.multiply(x, 1 / s.temperature);
    return mx.random.categorical(scaled, drawKey ? { key: drawKey } : {});
  } finally {
    coinKey?.dispose();
    drawKey?.dispose();
  }
}

/**
 * The logits `sample` draws from at temperature > 0: top-p, min-p, top-k on the
 * log-probabilities, then / T (unnormalized). Speculative decoding normalizes these to the
 * exact distributions it compares. With XTC, whose coin is random, this is the marginal
 * distribution: log((1 - p) softmax(a) + p softmax(b)), a without XTC, b with it (float32).
 */
export function temperedLogits(lp: MlxArray, s: ResolvedSampling): MlxArray {
  if (s.temperature === 0) throw new MlxError("temperedLogits: temperature 0 is greedy (argmax), not a distribution");
  const tempered = (xtc: "always" | undefined): MlxArray => {
    using x = filtered(lp, s, xtc);
    return mx.multiply(x, 1 / s.temperature);
  };
  if (s.xtcProbability === 0) return tempered(undefined);
  using b = tempered("always");
  if (s.xtcProbability === 1) return b.retain();
  using a = tempered(undefined);
  const logNorm = (t: MlxArray, w: number): MlxArray => {
    using t32 = mx.astype(t, "float32");
    using lse = mx.logsumexp(t32, -1, { keepdims: true });
    using n = mx.subtract(t32, lse);
    return mx.add(n, Math.log(w));
  };
  using la = logNorm(a, 1 - s.xtcProbability);
  using lb = logNorm(b, s.xtcProbability);
  return mx.logaddexp(la, lb);
}

/** A per-request key stream: same seed → same keys, independent of other requests. */
export class KeyStream implements Disposable {
  #key: MlxArray;
  /** `skip`: keys to pass over first (as if `skip` draws had been made from the stream). */
  constructor(seed: number, skip = 0) {
    this.#key = mx.random.key(seed);
    for (let i = 0; i < skip; i++) this.next().dispose();
  }
  /** The next subkey. */
  next(): MlxArray {
    using both = mx.random.split(this.#key);
    const k = mx.index(both, 0);
    const sub = mx.index(both, 1);
    this.#key.dispose();
    this.#key = k;
    return sub;
  }
  dispose(): void {
    this.#key.dispose();
  }
  [Symbol.dispose](): void {
    this.dispose();
  }
}
