// The acceptance rule of speculative sampling (Leviathan et al. 2023, Chen et al. 2023): a drafted
// token x is kept with probability min(1, p(x) / q(x)); at the first rejection the token is drawn
// from norm(max(0, p - q)); when every draft is kept, a bonus token is drawn from the next p.
// The emitted tokens are then distributed exactly as the target's p (docs/speculative.md).
import { MlxError, type MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { type ResolvedSampling, temperedLogits } from "./sampling.ts";

/**
 * The normalized log-probabilities [R, V] (float32) that sampling at `s` draws from, for processed
 * log-probabilities `lp` [R, V]: the filters and temperature of `sample`, then log-softmax.
 */
export function samplingLogProbs(lp: MlxArray, s: ResolvedSampling): MlxArray {
  using t = temperedLogits(lp, s);
  using t32 = mx.astype(t, "float32");
  using lse = mx.logsumexp(t32, -1, { keepdims: true });
  return mx.subtract(t32, lse);
}

/** Lazy outcome of one verification: per drafted row, kept or not; per row, the token to emit there. */
export interface RejectionDraws extends Disposable {
  /** bool [k]: drafted token j is kept (given the drafts before it were). */
  accept: MlxArray;
  /** int [k + 1]: row j < k a draw from norm(max(0, p_j - q_j)) (used if draft j is rejected); row k a draw from p_k (the bonus). */
  candidates: MlxArray;
}

/**
 * Rejection sampling over k drafted tokens at once. `p` [k + 1, V] are the target's sampling
 * log-probabilities (row j given the prompt and drafts before j), `q` [k, V] the draft's, `drafted`
 * [k] the drafted ids (each sampled from its q row). Rows are independent, so one call also
 * serves as k independent trials (the chi-square test uses that).
 */
export function rejectionSample(p: MlxArray, q: MlxArray, drafted: MlxArray, key: MlxArray): RejectionDraws {
  const k = q.shape[0]!;
  if (p.ndim !== 2 || q.ndim !== 2 || p.shape[0] !== k + 1 || p.shape[1] !== q.shape[1]) {
    throw new MlxError(`rejectionSample: p must be [k + 1, V] and q [k, V], got ${p.describe()} and ${q.describe()}`);
  }
  if (drafted.size !== k) throw new MlxError(`rejectionSample: ${k} draft rows but ${drafted.size} drafted tokens`);
  using keys = mx.random.split(key);
  using kU = mx.index(keys, 0);
  using kC = mx.index(keys, 1);
  using p32 = mx.astype(p, "float32");
  using q32 = mx.astype(q, "float32");
  using pk = mx.index(p32, mx.sl(0, k));
  using P = mx.exp(pk);
  using Q = mx.exp(q32);
  using d32 = mx.astype(drafted, "int32");
  using idx = mx.reshape(d32, [k, 1]);
  using pd = mx.take_along_axis(P, idx, -1);
  using qd = mx.take_along_axis(Q, idx, -1);
  using u = mx.random.uniform(0, 1, [k, 1], { key: kU });
  // u < p/q without dividing: q(x) > 0 for a token drawn from q.
  using uq = mx.multiply(u, qd);
  using keep = mx.less(uq, pd);
  const accept = mx.reshape(keep, [k]);
  using diff = mx.subtract(P, Q);
  using resid = mx.maximum(diff, 0);
  using mass = mx.sum(resid, -1, { keepdims: true });
  using logResid = mx.log(resid);
  // p == q on a row leaves no residual mass; that row always accepts, so any draw will do.
  using empty = mx.less_equal(mass, 0);
  using rows = mx.where(empty, pk, logResid);
  using last = mx.index(p32, mx.sl(k, k + 1));
  using all = mx.concatenate([rows, last], 0);
  const candidates = mx.random.categorical(all, { key: kC });
  return {
    accept,
    candidates,
    [Symbol.dispose]() {
      accept.dispose();
      candidates.dispose();
    },
  };
}

/** Host side of a verification: how many drafts are kept, and the index of the emitted row. */
export function firstRejection(accept: readonly boolean[]): number {
  const i = accept.indexOf(false);
  return i < 0 ? accept.length : i;
}
