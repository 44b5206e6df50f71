// Logits processors and samplers, as mlx-lm's sample_utils.py: logit bias, repetition /
// presence / frequency penalties over a context window, then top-p, min-p, top-k on the
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
  repetitionPenalty: number;
  presencePenalty: number;
  frequencyPenalty: number;
  penaltyContext: number;
  logitBias: [number, number][];
  seed: number | undefined;
}

/** Apply defaults and validate; errors name the field. */
export function resolveSampling(p: SamplingParams = {}, vocabSize: number): ResolvedSampling {
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
  return {
    temperature: num("temperature", p.temperature, 0, (x) => x >= 0, ">= 0"),
    topP: num("top_p", p.topP, 1, (x) => x > 0 && x <= 1, "in (0, 1]"),
    topK: num("top_k", p.topK, 0, (x) => Number.isInteger(x) && x >= 0, "a non-negative integer"),
    minP: num("min_p", p.minP, 0, (x) => x >= 0 && x <= 1, "in [0, 1]"),
    repetitionPenalty: num("repetition_penalty", p.repetitionPenalty, 1, (x) => x > 0, "> 0"),
    presencePenalty: num("presence_penalty", p.presencePenalty, 0, () => true, "a number"),
    frequencyPenalty: num("frequency_penalty", p.frequencyPenalty, 0, () => true, "a number"),
    penaltyContext: num("repetition_context_size", p.penaltyContext, 20, (x) => Number.isInteger(x) && x > 0, "a positive integer"),
    logitBias,
    seed,
  };
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
        step(updateColumns(out, uniq, (sel) => {
          using neg = mx.less(sel, 0);
          using mul = mx.multiply(sel, p);
          using div = mx.divide(sel, p);
          return mx.where(neg, mul, div);
        }));
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

function applyMinP(lp: MlxArray, minP: number): MlxArray {
  using top = mx.max(lp, -1, { keepdims: true });
  using scaled = mx.add(top, Math.log(minP));
  using remove = mx.less(lp, scaled);
  return mx.where(remove, Number.NEGATIVE_INFINITY, lp);
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
 * The sampled token ids [B] from log-probabilities [B, V]: argmax at temperature 0, else the
 * filters of mlx-lm's make_sampler (top-p, min-p, top-k) and categorical(logprobs / T) with `key`.
 */
export function sample(lp: MlxArray, s: ResolvedSampling, key: MlxArray | undefined): MlxArray {
  if (s.temperature === 0) return mx.argmax(lp, -1);
  using scaled = temperedLogits(lp, s);
  return mx.random.categorical(scaled, key ? { key } : {});
}

/**
 * The logits `sample` draws from at temperature > 0: top-p, min-p, top-k on the
 * log-probabilities, then / T (unnormalized). Speculative decoding normalizes these to the
 * exact distributions it compares.
 */
export function temperedLogits(lp: MlxArray, s: ResolvedSampling): MlxArray {
  if (s.temperature === 0) throw new MlxError("temperedLogits: temperature 0 is greedy (argmax), not a distribution");
  let x = lp.retain();
  const step = (next: MlxArray): void => {
    x.dispose();
    x = next;
  };
  if (s.topP > 0 && s.topP < 1) step(applyTopP(x, s.topP));
  if (s.minP !== 0) step(applyMinP(x, s.minP));
  if (s.topK > 0) step(applyTopK(x, s.topK));
  try {
    return mx.multiply(x, 1 / s.temperature);
  } finally {
    x.dispose();
  }
}

/** A per-request key stream: same seed → same keys, independent of other requests. */
export class KeyStream implements Disposable {
  #key: MlxArray;
  constructor(seed: number) {
    this.#key = mx.random.key(seed);
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
