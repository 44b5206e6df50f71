// Speculative decoding: a drafter proposes k tokens one at a time, the target verifies all of them
// in one forward pass, the caches are cut back to what was kept. Greedy: a draft is kept while it
// equals the target's argmax (output = plain greedy). Sampling: the rejection rule of
// speculative-sampling.ts (output distribution = the target's). The drafter is a separate draft
// model with its own caches, or a Gemma 4 MTP drafter (an "assistant") that reads the target's
// hidden state and K/V; both plug into the same verify/accept round. Design: docs/speculative.md.
import { asyncEval, evaluate, memory, MlxArray, MlxError } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { type Cache, type CacheState, KVCache, type Mask, RotatingKVCache } from "@mlx-bun/kv-cache";
import { type DrafterKv, Gemma4Assistant, type LayerType, type LoadedAssistant } from "@mlx-bun/models";
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
  /** Draft tokens per round (--num-draft-tokens; default 3, an MTP drafter's block_size - 1); a request may set its own. */
  numDraftTokens?: number;
  /** Called after each round: the drafted ids (none in a round that drafts nothing) and how many the target kept. */
  onRound?: (r: { drafted: number[]; accepted: number }) => void;
}

/** What proposes the draft tokens: a separate draft model (its own caches) or a Gemma 4 MTP drafter. */
export type Drafter = GenerationEngine | LoadedAssistant;

function isAssistant(d: Drafter): d is LoadedAssistant {
  return "model" in d && d.model instanceof Gemma4Assistant;
}

/**
 * The target and a drafter of speculative decoding; runs one request at a time. The drafter is a
 * draft model sharing the tokenizer, or a Gemma 4 MTP drafter (loadAssistant) made for this target
 * (its default number of draft tokens is then the checkpoint's block_size - 1).
 */
export class SpeculativeDecoder {
  readonly numDraftTokens: number;
  readonly #lock = new Mutex();
  /** The draft engine, when the drafter is a separate model. */
  readonly draftEngine: GenerationEngine | undefined;
  /** The MTP drafter, when the drafter is one. */
  readonly assistant: Gemma4Assistant | undefined;
  /** MTP: per drafter layer type, the index of the target cache it reads (the last K/V-owning layer of that type). */
  readonly #kvSource = new Map<LayerType, number>();
  readonly #onRound: SpeculativeOptions["onRound"];

  constructor(
    readonly target: GenerationEngine,
    readonly draft: Drafter,
    opts: SpeculativeOptions = {},
  ) {
    if (isAssistant(draft)) {
      this.assistant = draft.model;
      this.assistant.checkTarget(target.loaded.config);
      if (!target.forwardHidden)
        throw new MlxError("speculative decoding with an MTP drafter needs a target engine that returns hidden states (forwardHidden)");
      const specs = target.loaded.model.specs.filter((s) => s.hasKv);
      for (const t of this.assistant.layerTypes) this.#kvSource.set(t, specs.filter((s) => s.type === t).at(-1)!.index);
    } else {
      this.draftEngine = draft;
      const tv = target.loaded.tokenizer.vocabSize;
      const dv = draft.loaded.tokenizer.vocabSize;
      if (tv !== dv)
        throw new MlxError(`the draft model's vocabulary (${dv} tokens) differs from the target's (${tv}); speculative decoding needs a shared tokenizer`);
      const tl = target.loaded.config.text.vocabSize;
      const dl = draft.loaded.config.text.vocabSize;
      if (tl !== dl) throw new MlxError(`the draft model's output layer has ${dl} logits, the target's ${tl}; speculative decoding needs the same vocabulary`);
    }
    this.#onRound = opts.onRound;
    const def = this.assistant ? this.assistant.defaultDraftTokens : DEFAULT_NUM_DRAFT_TOKENS;
    this.numDraftTokens = checkDraftTokens(opts.numDraftTokens ?? def, "numDraftTokens");
    // Refuse at start-up any cache kind whose trims this path cannot make exact.
    for (const [name, e] of [["target", target] as const, ...(this.draftEngine ? [["draft", this.draftEngine] as const] : [])]) {
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
    const s = seq.sampling;
    const keys = s.temperature > 0 ? new KeyStream(s.seed ?? Math.floor(Math.random() * 2 ** 31)) : undefined;
    const stats = { drafted: 0, accepted: 0 };
    seq.speculative = stats;
    let session: DraftSession | undefined;
    let failure: unknown;
    try {
      const prompt = seq.req.promptIds;
      // The target gets all prompt tokens but the last; each round starts from the unfed tail.
      let y = this.target.prefill(prompt, tc, 1, onPrefill);
      session = this.draftEngine ? new ModelDraftSession(this.draftEngine, prompt) : new MtpDraftSession(this.assistant!, this.target, tc, this.#kvSource);
      for (let round = 1; ; round++) {
        await yieldToEventLoop();
        if (seq.req.signal?.aborted) seq.cancel();
        if (seq.done) break;
        const k = Math.min(K, seq.req.maxTokens - seq.generated.length, session.limit(K));
        const r = this.#round(seq, y, session, k, tc, keys);
        stats.drafted += k;
        stats.accepted += r.accepted;
        y = [r.token];
        if (round % 64 === 0) memory.clearCache();
      }
    } catch (e) {
      failure = e;
    } finally {
      session?.dispose();
      for (const c of tc) c.dispose();
      keys?.dispose();
      if (failure !== undefined) seq.channel.fail(failure);
      else seq.finish();
      seq.dispose();
    }
  }

  /**
   * One round: draft k tokens (k may be 0: a plain target step), verify [y, drafts] with the
   * target, emit the kept drafts and one target token, and cut the caches back.
   */
  #round(seq: Sequence, y: number[], session: DraftSession, k: number, tc: Cache[], keys: KeyStream | undefined): { accepted: number; token: number } {
    const s = seq.sampling;
    const greedy = s.temperature === 0;
    const drafts: MlxArray[] = [];
    const qRows: MlxArray[] = [];
    const tRows: MlxArray[] = [];
    const pRows: MlxArray[] = [];
    const owned: MlxArray[] = [];
    let hidden: MlxArray | null = null;
    try {
      if (k > 0) session.draft(seq, y, k, keys, { drafts, qRows, owned });
      let draftedIds: number[] = [];
      let draftedHost: number[] = [];
      let draft32: MlxArray | null = null;
      using y0 = MlxArray.fromNumbers(y, [y.length], "int32");
      let ids: MlxArray;
      if (k > 0) {
        using draftIds = mx.concatenate(drafts, 0);
        draft32 = mx.astype(draftIds, "int32");
        owned.push(draft32);
        // Histories for the penalties need the drafted ids on the host.
        draftedHost = seq.needsHistory ? Array.from(draft32.toFloat64Array()) : [];
        using ids1 = mx.concatenate([y0, draft32], 0);
        ids = mx.reshape(ids1, [1, y.length + k]);
      } else ids = mx.reshape(y0, [1, y.length]);
      owned.push(ids);
      // Verify [y, d_0 .. d_{k-1}] in one pass; row j predicts the token after d_{j-1}.
      let logits: MlxArray;
      if (session.needsHidden) {
        const r = this.target.forwardHidden!(ids, tc);
        hidden = r.hidden;
        logits = r.logits;
      } else logits = this.target.forward(ids, tc);
      owned.push(logits);
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
      if (draft32) draftedIds = Array.from(draft32.toFloat64Array());
      if (greedy) {
        using all = mx.concatenate(tRows, 0);
        using picks = mx.argmax(all, -1);
        const t = Array.from(picks.toFloat64Array());
        accepted = firstRejection(draftedIds.map((d, j) => d === t[j]));
        token = t[accepted]!;
      } else if (k === 0) {
        using key = keys!.next();
        using t = mx.random.categorical(pRows[0]!, { key });
        accepted = 0;
        token = t.toFloat64Array()[0]!;
      } else {
        using p = mx.concatenate(pRows, 0);
        using q = mx.concatenate(qRows, 0);
        using key = keys!.next();
        using r = rejectionSample(p, q, draft32!, key);
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
      session.commit(k, accepted, token, draftedIds, hidden);
      this.#onRound?.({ drafted: draftedIds, accepted });
      return { accepted, token };
    } finally {
      for (const a of [...drafts, ...qRows, ...tRows, ...pRows, ...owned]) a.dispose();
      hidden?.dispose();
      session.endRound();
    }
  }
}

/** Where a round's drafts go: device ids [1] each, q rows (sampling), and arrays to free after the round. */
interface DraftOut {
  drafts: MlxArray[];
  qRows: MlxArray[];
  owned: MlxArray[];
}

/** A drafter's per-request state across rounds. */
interface DraftSession extends Disposable {
  /** The verify pass must return the target's hidden state (MTP). */
  readonly needsHidden: boolean;
  /** Drafts the next round can make, at most `k` (MTP: 0 until a target hidden state was read). */
  limit(k: number): number;
  /** Propose k tokens after the target's unfed tail `y`. */
  draft(seq: Sequence, y: number[], k: number, keys: KeyStream | undefined, out: DraftOut): void;
  /** After verification: `accepted` of `k` drafts kept and the target's `token`; `hidden`: the verify pass's [1, k + 1, H] (borrowed). */
  commit(k: number, accepted: number, token: number, draftedIds: number[], hidden: MlxArray | null): void;
  /** End of a round, whether it completed or failed. */
  endRound(): void;
  dispose(): void;
}

/** One token from a drafter's logits row [1, V]: the request's processors, then argmax or a draw from the sampling distribution (kept as q). */
function pickDraft(seq: Sequence, row: MlxArray, hist: readonly number[], keys: KeyStream | undefined, out: DraftOut): MlxArray {
  using processed = seq.process(row, hist);
  using lp = logSoftmax(processed);
  if (!keys) return mx.argmax(lp, -1);
  const q = samplingLogProbs(lp, seq.sampling);
  out.qRows.push(q);
  using key = keys.next();
  return mx.random.categorical(q, { key });
}

/** A separate draft model with its own caches: k single-token steps; its caches are cut back after verification. */
class ModelDraftSession implements DraftSession {
  readonly needsHidden = false;
  readonly #dc: Cache[];
  /** What the next round feeds the draft model. */
  #dy: number[];
  #snaps: Snapshot[] | null = null;

  constructor(
    readonly engine: GenerationEngine,
    prompt: readonly number[],
  ) {
    this.#dc = engine.makeCaches();
    try {
      this.#dy = engine.prefill(prompt, this.#dc, 1);
    } catch (e) {
      for (const c of this.#dc) c.dispose();
      throw e;
    }
  }

  limit(k: number): number {
    return k;
  }

  draft(seq: Sequence, _y: number[], k: number, keys: KeyStream | undefined, out: DraftOut): void {
    const dc = this.#dc;
    const dy = this.#dy;
    // A wrapped sliding window loses overwritten slots, so rewind those draft caches from a snapshot.
    this.#snaps = dc.some((c) => c instanceof RotatingKVCache && c.offset + dy.length + k >= c.maxSize) ? snapshot(dc) : null;
    // k steps, each fed the last (device) token; the host reads them after verification.
    let feed = MlxArray.fromNumbers(dy, [1, dy.length], "int32");
    out.owned.push(feed);
    const hist: number[] = seq.history;
    for (let i = 0; i < k; i++) {
      using logits = this.engine.forward(feed, dc);
      using row = mx.index(logits, ":", -1, ":");
      const d = pickDraft(seq, row, hist, keys, out);
      out.drafts.push(d);
      const d32 = mx.astype(d, "int32");
      feed = mx.reshape(d32, [1, 1]);
      d32.dispose();
      out.owned.push(feed);
      asyncEval(d);
    }
  }

  commit(k: number, accepted: number, token: number, draftedIds: number[]): void {
    const dc = this.#dc;
    // The draft holds dy and d_0..d_{k-2}.
    if (accepted === k) this.#dy = [draftedIds[k - 1]!, token];
    else {
      const drop = k - 1 - accepted;
      if (dc.every((c) => canTrim(c, drop))) {
        trimAll(dc, drop, "draft");
        this.#dy = [token];
      } else {
        if (!this.#snaps) throw new MlxError("speculative decoding: a draft cache cannot be trimmed and no snapshot was taken");
        // Back to the round's start; the next draft step re-feeds what was kept.
        restore(dc, this.#snaps);
        this.#dy = [...this.#dy, ...draftedIds.slice(0, accepted), token];
      }
    }
  }

  endRound(): void {
    if (this.#snaps) for (const sn of this.#snaps) sn.state?.[Symbol.dispose]();
    this.#snaps = null;
  }

  dispose(): void {
    this.endRound();
    for (const c of this.#dc) c.dispose();
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}

/**
 * A Gemma 4 MTP drafter (mlx-vlm's _mtp_rounds): no cache of its own. Each draft step reads
 * [target embed(token) · √hidden, h] at a fixed position (the last token the target holds), with
 * h first the target's normed hidden state there, then the drafter's own post-projected state;
 * it attends over the target's caches as they are after the last trim.
 */
class MtpDraftSession implements DraftSession {
  readonly needsHidden = true;
  /** The target's final-normed hidden state [1, 1, H] at its last cached token (null before the first verify). */
  #hidden: MlxArray | null = null;

  constructor(
    readonly assistant: Gemma4Assistant,
    readonly target: GenerationEngine,
    readonly tc: Cache[],
    readonly kvSource: ReadonlyMap<LayerType, number>,
  ) {}

  limit(k: number): number {
    return this.#hidden ? k : 0;
  }

  /** Per layer type, a view of the target cache the drafter reads, and its mask (sliding: the last `window` tokens). */
  #views(): Map<LayerType, DrafterKv> {
    const kv = new Map<LayerType, DrafterKv>();
    try {
      for (const [type, i] of this.kvSource) {
        const c = this.tc[i] as KVCache | RotatingKVCache;
        const st = c.state();
        const n = st.tensors[0]!.shape[2]!;
        const view = c.codec.view([...st.tensors], n);
        const window = this.assistant.specs.find((s) => s.type === type)!.window;
        // A rotating cache after a verify chunk holds up to window - 1 + k + 1 tokens in temporal
        // order; the query (the newest position) sees the last `window` of them (mlx-vlm's
        // bidirectional_swa_mask). A wrapped ring holds exactly `window` tokens: no mask.
        let mask: Mask = null;
        if (window !== null && n > window) {
          using r = mx.arange(n);
          using m = mx.greater_equal(r, n - window);
          mask = mx.reshape(m, [1, 1, 1, n]);
        }
        kv.set(type, { view, mask });
      }
    } catch (e) {
      releaseViews(kv);
      throw e;
    }
    return kv;
  }

  draft(seq: Sequence, y: number[], k: number, keys: KeyStream | undefined, out: DraftOut): void {
    const model = this.target.loaded.model;
    const kv = this.#views();
    try {
      const position = MlxArray.scalar(this.tc[0]!.offset - 1, "int32");
      out.owned.push(position);
      // Greedy without processors: the drafter's own argmax (the centroid head skips full logits, as mlx-vlm).
      const plainArgmax = !keys && seq.processors.length === 0;
      let tok = MlxArray.fromNumbers([y[y.length - 1]!], [1, 1], "int32");
      out.owned.push(tok);
      let h = this.#hidden!;
      for (let i = 0; i < k; i++) {
        using emb = model.embedScaled(tok);
        using inputs = mx.concatenate([emb, h], -1);
        const r = this.assistant.step(inputs, kv, position);
        out.owned.push(r.hidden);
        h = r.hidden;
        using normed = r.normed;
        let d: MlxArray;
        if (plainArgmax) {
          using a = this.assistant.argmax(normed);
          d = mx.reshape(a, [1]);
        } else {
          using logits = this.assistant.logits(normed);
          using row = mx.reshape(logits, [1, logits.shape[2]!]);
          d = pickDraft(seq, row, seq.history, keys, out);
        }
        out.drafts.push(d);
        using d32 = mx.astype(d, "int32");
        tok = mx.reshape(d32, [1, 1]);
        out.owned.push(tok);
        asyncEval(d);
      }
    } finally {
      releaseViews(kv);
    }
  }

  commit(_k: number, accepted: number, _token: number, _ids: number[], hidden: MlxArray | null): void {
    if (!hidden) throw new MlxError("speculative decoding: the MTP drafter needs the verify pass's hidden state");
    // The next round reads the target's state at the last kept input (mlx-vlm: verify.hidden[:, accepted]).
    using row = mx.index(hidden, ":", mx.sl(accepted, accepted + 1), ":");
    const next = this.target.loaded.model.finalNorm(row);
    this.#hidden?.dispose();
    this.#hidden = next;
  }

  endRound(): void {}

  dispose(): void {
    this.#hidden?.dispose();
    this.#hidden = null;
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}

function releaseViews(kv: Map<LayerType, DrafterKv>): void {
  for (const { view, mask } of kv.values()) {
    view.dispose();
    if (mask !== null && mask !== "causal") mask.dispose();
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
