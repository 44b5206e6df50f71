// Speculative decoding: a small draft model proposes k tokens one at a time, the target verifies
// all of them in one forward pass, both caches are cut back to what was kept. Greedy: a draft is
// kept while it equals the target's argmax (output = plain greedy). Sampling: the rejection rule
// of speculative-sampling.ts (output distribution = the target's). Design: docs/speculative.md.
import { asyncEval, evaluate, memory, MlxArray, MlxError } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { type Cache, type CacheState, KVCache, RotatingKVCache } from "@mlx-bun/kv-cache";
import { Mutex, yieldToEventLoop } from "./async.ts";
import type { GenerationEngine, PrefillProgress } from "./engine-contract.ts";
import { RequestError, validateRequest } from "./request.ts";
import { KeyStream, logSoftmax } from "./sampling.ts";
import { Sequence } from "./sequence.ts";
import { firstRejection, rejectionSample, samplingLogProbs } from "./speculative-sampling.ts";
import type { GenerateRequest, GenerationStream } from "./types.ts";

/** mlx_lm.generate / mlx_lm.server's --num-draft-tokens default. */
export const DEFAULT_NUM_DRAFT_TOKENS = 3;

export interface SpeculativeOptions {
  /** Draft tokens per round (--num-draft-tokens; default 3); a request may set its own. */
  numDraftTokens?: number;
}

/** The target and draft models of speculative decoding; runs one request at a time. */
export class SpeculativeDecoder {
  readonly numDraftTokens: number;
  readonly #lock = new Mutex();

  constructor(
    readonly target: GenerationEngine,
    readonly draft: GenerationEngine,
    opts: SpeculativeOptions = {},
  ) {
    this.numDraftTokens = checkDraftTokens(opts.numDraftTokens ?? DEFAULT_NUM_DRAFT_TOKENS, "numDraftTokens");
    const tv = target.loaded.tokenizer.vocabSize;
    const dv = draft.loaded.tokenizer.vocabSize;
    if (tv !== dv)
      throw new MlxError(`the draft model's vocabulary (${dv} tokens) differs from the target's (${tv}); speculative decoding needs a shared tokenizer`);
    const tl = target.loaded.config.text.vocabSize;
    const dl = draft.loaded.config.text.vocabSize;
    if (tl !== dl) throw new MlxError(`the draft model's output layer has ${dl} logits, the target's ${tl}; speculative decoding needs the same vocabulary`);
    // Refuse at start-up any cache kind whose trims this path cannot make exact.
    for (const [name, e] of [
      ["target", target],
      ["draft", draft],
    ] as const) {
      const cs = e.makeCaches();
      try {
        for (const c of cs) {
          if (!(c instanceof KVCache || c instanceof RotatingKVCache))
            throw new MlxError(`speculative decoding: the ${name} model's cache ${c.signature()} cannot be trimmed back`);
        }
      } finally {
        for (const c of cs) c.dispose();
      }
    }
  }

  /** Draft tokens a request runs with (its own numDraftTokens, else the decoder's). */
  draftTokensFor(req: GenerateRequest): number {
    return req.numDraftTokens === undefined ? this.numDraftTokens : checkDraftTokens(req.numDraftTokens, "num_draft_tokens");
  }

  /** Generate one request speculatively (with numDraftTokens 0: plain decoding by the target engine). */
  generate(req: GenerateRequest, opts: { onPrefill?: PrefillProgress } = {}): GenerationStream {
    validateRequest(req, this.target);
    const k = this.draftTokensFor(req);
    // Processors with asynchronous work per token (grammars) cannot run inside the synchronous draft rounds.
    if (k === 0 || req.logitsProcessors?.some((p) => p.advance)) return this.target.generate(req, opts.onPrefill ? { onPrefill: opts.onPrefill } : {});
    const seq = new Sequence(req, this.target.loaded.tokenizer);
    void this.#run(seq, k, opts.onPrefill);
    return seq.channel;
  }

  async #run(seq: Sequence, K: number, onPrefill?: PrefillProgress): Promise<void> {
    using _held = await this.#lock.acquire();
    const tc = this.target.makeCaches();
    const dc = this.draft.makeCaches();
    const s = seq.sampling;
    const keys = s.temperature > 0 ? new KeyStream(s.seed ?? Math.floor(Math.random() * 2 ** 31)) : undefined;
    const stats = { drafted: 0, accepted: 0 };
    seq.speculative = stats;
    let failure: unknown;
    try {
      const prompt = seq.req.promptIds;
      // Both models get all prompt tokens but the last; each round starts from the unfed tail.
      let y = this.target.prefill(prompt, tc, 1, onPrefill);
      let dy = this.draft.prefill(prompt, dc, 1);
      for (let round = 1; ; round++) {
        await yieldToEventLoop();
        if (seq.req.signal?.aborted) seq.cancel();
        if (seq.done) break;
        const k = Math.min(K, seq.req.maxTokens - seq.generated.length);
        const r = this.#round(seq, y, dy, k, tc, dc, keys);
        stats.drafted += k;
        stats.accepted += r.accepted;
        y = [r.token];
        dy = r.nextDraftIds;
        if (round % 64 === 0) memory.clearCache();
      }
    } catch (e) {
      failure = e;
    } finally {
      for (const c of [...tc, ...dc]) c.dispose();
      keys?.dispose();
      if (failure !== undefined) seq.channel.fail(failure);
      else seq.finish();
      seq.dispose();
    }
  }

  /**
   * One round: draft k tokens from `dy`, verify [y, drafts] with the target, emit the kept drafts
   * and one target token, and cut both caches back. Returns what the next round feeds.
   */
  #round(
    seq: Sequence,
    y: number[],
    dy: number[],
    k: number,
    tc: Cache[],
    dc: Cache[],
    keys: KeyStream | undefined,
  ): { accepted: number; token: number; nextDraftIds: number[] } {
    const s = seq.sampling;
    const greedy = s.temperature === 0;
    // A wrapped sliding window loses overwritten slots, so rewind those draft caches from a snapshot.
    const snaps = dc.some((c) => c instanceof RotatingKVCache && c.offset + dy.length + k >= c.maxSize) ? snapshot(dc) : null;
    const drafts: MlxArray[] = [];
    const qRows: MlxArray[] = [];
    const tRows: MlxArray[] = [];
    const pRows: MlxArray[] = [];
    const owned: MlxArray[] = [];
    try {
      // Draft: k steps, each fed the last (device) token; the host reads them after verification.
      let feed = MlxArray.fromNumbers(dy, [1, dy.length], "int32");
      owned.push(feed);
      const hist: number[] = seq.history;
      for (let i = 0; i < k; i++) {
        using logits = this.draft.forward(feed, dc);
        using row = mx.index(logits, ":", -1, ":");
        using processed = seq.process(row, hist);
        using lp = logSoftmax(processed);
        let d: MlxArray;
        if (greedy) d = mx.argmax(lp, -1);
        else {
          const q = samplingLogProbs(lp, s);
          qRows.push(q);
          using key = keys!.next();
          d = mx.random.categorical(q, { key });
        }
        drafts.push(d);
        const d32 = mx.astype(d, "int32");
        feed = mx.reshape(d32, [1, 1]);
        d32.dispose();
        owned.push(feed);
        asyncEval(d);
      }
      using draftIds = mx.concatenate(drafts, 0);
      using draft32 = mx.astype(draftIds, "int32");
      // Histories for the penalties need the drafted ids on the host.
      const draftedHost = seq.needsHistory ? Array.from(draft32.toFloat64Array()) : [];
      // Verify [y, d_0 .. d_{k-1}] in one pass; row j predicts the token after d_{j-1}.
      using y0 = MlxArray.fromNumbers(y, [y.length], "int32");
      using ids1 = mx.concatenate([y0, draft32], 0);
      using ids = mx.reshape(ids1, [1, k + 1]);
      using logits = this.target.forward(ids, tc);
      for (let j = 0; j <= k; j++) {
        using row = mx.index(logits, ":", j, ":");
        using row2 = mx.reshape(row, [1, row.shape[row.ndim - 1]!]);
        const h = seq.needsHistory ? [...seq.history, ...draftedHost.slice(0, j)] : seq.history;
        using processed = seq.process(row2, h);
        const lp = logSoftmax(processed);
        tRows.push(lp);
        if (!greedy) pRows.push(samplingLogProbs(lp, s));
      }
      let accepted: number;
      let token: number;
      const draftedIds = Array.from(draft32.toFloat64Array());
      if (greedy) {
        using all = mx.concatenate(tRows, 0);
        using picks = mx.argmax(all, -1);
        const t = Array.from(picks.toFloat64Array());
        accepted = firstRejection(draftedIds.map((d, j) => d === t[j]));
        token = t[accepted]!;
      } else {
        using p = mx.concatenate(pRows, 0);
        using q = mx.concatenate(qRows, 0);
        using key = keys!.next();
        using r = rejectionSample(p, q, draft32, key);
        evaluate(r.accept, r.candidates);
        const acc = Array.from(r.accept.toFloat64Array(), (v) => v !== 0);
        accepted = firstRejection(acc);
        token = r.candidates.toFloat64Array()[accepted]!;
      }
      // Emit the kept drafts, then the target's token; a stop ends the request mid-round.
      for (let j = 0; j <= accepted && !seq.done; j++) {
        const tok = j < accepted ? draftedIds[j]! : token;
        using t = MlxArray.fromNumbers([tok], [1], "int32");
        seq.accept({ token: t, logprobs: tRows[j]! });
      }
      // The target holds y and all k drafts: keep y and the accepted ones.
      trimAll(tc, k - accepted, "target");
      // The draft holds dy and d_0..d_{k-2}.
      let nextDraftIds: number[];
      if (accepted === k) nextDraftIds = [draftedIds[k - 1]!, token];
      else {
        const drop = k - 1 - accepted;
        if (dc.every((c) => canTrim(c, drop))) {
          trimAll(dc, drop, "draft");
          nextDraftIds = [token];
        } else {
          if (!snaps) throw new MlxError("speculative decoding: a draft cache cannot be trimmed and no snapshot was taken");
          // Back to the round's start; the next draft step re-feeds what was kept.
          restore(dc, snaps);
          nextDraftIds = [...dy, ...draftedIds.slice(0, accepted), token];
        }
      }
      return { accepted, token, nextDraftIds };
    } finally {
      for (const a of [...drafts, ...qRows, ...tRows, ...pRows, ...owned]) a.dispose();
      if (snaps) for (const sn of snaps) sn.state?.[Symbol.dispose]();
    }
  }
}

interface Snapshot {
  offset: number;
  /** Rotating caches only: their full state (the others rewind by trimming). */
  state: CacheState | null;
}

function snapshot(caches: Cache[]): Snapshot[] {
  return caches.map((c) => ({ offset: c.offset, state: c instanceof RotatingKVCache ? c.state() : null }));
}

function restore(caches: Cache[], snaps: Snapshot[]): void {
  caches.forEach((c, i) => {
    const sn = snaps[i]!;
    if (sn.state) {
      c.restoreState(sn.state);
      // restoreState adopted the tensors.
      sn.state = null;
    } else c.trim(c.offset - sn.offset);
  });
}

function canTrim(c: Cache, n: number): boolean {
  return c.canTrim ? c.canTrim(n) : c.isTrimmable();
}

function trimAll(caches: Cache[], n: number, which: string): void {
  if (n === 0) return;
  // Checked first for every cache: a half-trimmed set would hold different tokens per layer.
  const bad = caches.find((c) => !canTrim(c, n));
  if (bad) throw new MlxError(`speculative decoding: the ${which} cache ${bad.signature()} cannot trim ${n} tokens at offset ${bad.offset}`);
  for (const c of caches) c.trim(n);
}

function checkDraftTokens(n: number, name: string): number {
  if (!Number.isInteger(n) || n < 0 || n > 64) throw new RequestError(`${name} must be an integer in 0..64, got ${JSON.stringify(n)}`);
  return n;
}
