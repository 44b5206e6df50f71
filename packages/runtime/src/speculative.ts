// Speculative decoding: a drafter proposes k tokens one at a time, the target verifies all of them
// in one forward pass, the caches are cut back to what was kept. Greedy: a draft is kept while it
// equals the target's argmax (output = plain greedy). Sampling: the rejection rule of
// speculative-sampling.ts (output distribution = the target's). The drafter is a separate draft
// model with its own caches, or a Gemma 4 MTP drafter (an "assistant") that reads the target's
// hidden state and K/V; both plug into the same verify/accept round. Design: docs/speculative.md.
import { asyncEval, evaluate, memory, MlxArray, MlxError } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import {
  asBatchCache,
  type BatchCache,
  BatchKVCache,
  BatchRotatingKVCache,
  type Cache,
  type CacheState,
  isBatchCache,
  KVCache,
  type Mask,
  RotatingKVCache,
} from "@mlx-bun/kv-cache";
import { type DrafterKv, Gemma4Assistant, type LayerType, type LoadedAssistant } from "@mlx-bun/models";
import { Mutex, yieldToEventLoop } from "./async.ts";
import type { GenerationEngine, PrefillProgress } from "./engine-contract.ts";
import { RequestError, validateRequest } from "./request.ts";
import { KeyStream, logSoftmax } from "./sampling.ts";
import { type Pick, Sequence } from "./sequence.ts";
import { firstRejection, rejectionSample, samplingLogProbs } from "./speculative-sampling.ts";
import type { GenerateRequest, GenerationStream, SpeculativeStats } from "./types.ts";

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
  /** The MTP drafter's rounds (no per-request state: that is in each SpecRow). */
  readonly #mtp: MtpDrafter | undefined;
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
      this.#mtp = new MtpDrafter(this.assistant, target, this.#kvSource);
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

  /** Whether requests speculate inside the scheduler's decode batch (an MTP drafter: it has no caches of its own to batch). */
  get batches(): boolean {
    return this.#mtp !== undefined;
  }

  /** The speculative state of a request that decodes in a batch (Scheduler); the row owns it. */
  specRow(seq: Sequence, numDraftTokens: number): SpecRow {
    return new SpecRow(seq, numDraftTokens);
  }

  /**
   * One verify/accept round over every row of a decode batch (the runner's step when a row
   * speculates): speculative rows draft and verify, plain rows (`spec` null) take one token from
   * the same pass. `caches`: the batch's caches, or one row's single-sequence caches.
   */
  round(rows: readonly RoundRow[], caches: Cache[]): void {
    if (!this.#mtp) throw new MlxError("speculative decoding: only an MTP drafter speculates inside a batch (a draft model runs one request at a time)");
    // A batch always verifies a chunk (at least one padded draft): its rings stay in temporal order, so rows trim exactly.
    this.#round(rows, caches, this.#mtp, rows.length === 1 && !isBatchCache(caches[0]!) ? 0 : 1);
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
    const spec = new SpecRow(seq, K);
    let drafter: RoundDrafter | undefined;
    let failure: unknown;
    try {
      const prompt = seq.req.promptIds;
      // The target gets all prompt tokens but the last; each round starts from that unfed token.
      const y = this.target.prefill(prompt, tc, 1, onPrefill);
      if (y.length !== 1 || y[0] !== seq.history.at(-1)) throw new MlxError("speculative decoding: the prefill left other than the prompt's last token unfed");
      drafter = this.draftEngine ? new ModelDraftSession(this.draftEngine, prompt) : this.#mtp!;
      const rows = [{ seq, spec }];
      for (let round = 1; ; round++) {
        await yieldToEventLoop();
        if (seq.req.signal?.aborted) seq.cancel();
        if (seq.done) break;
        this.#round(rows, tc, drafter, 0);
        if (round % 64 === 0) memory.clearCache();
      }
    } catch (e) {
      failure = e;
    } finally {
      if (drafter !== this.#mtp) drafter?.dispose();
      for (const c of tc) c.dispose();
      spec.dispose();
      if (failure !== undefined) seq.channel.fail(failure);
      else seq.finish();
      seq.dispose();
    }
  }

  /**
   * One round over B rows (one request, or a decode batch): each speculative row drafts k_b
   * tokens (k_b may be 0: a plain target step), the target verifies [y_b, drafts_b] for every row
   * in one pass (rows with fewer drafts than the widest padded, at least `minWidth`), each row
   * emits its kept drafts and one target token, and each row's caches are cut back to what it
   * kept. Plain rows (spec null) pick their token from the pass's first position.
   */
  #round(rows: readonly RoundRow[], tc: Cache[], drafter: RoundDrafter, minWidth: number): void {
    const B = rows.length;
    const ready = drafter.ready(tc);
    const ks = rows.map((r) => {
      const sp = r.spec;
      if (!sp || r.seq.done || !ready) return 0;
      return Math.min(sp.numDraftTokens, r.seq.req.maxTokens - r.seq.generated.length, drafter.limit(sp, sp.numDraftTokens));
    });
    const D = Math.max(0, ...ks);
    const K = Math.max(minWidth, D);
    const out: DraftOut = { drafts: [], qRows: rows.map(() => []), owned: [] };
    const tRows: MlxArray[][] = rows.map(() => []);
    const pRows: MlxArray[][] = rows.map(() => []);
    const picks: (Pick | null)[] = rows.map(() => null);
    let hidden: MlxArray | null = null;
    try {
      if (D > 0) drafter.draft(rows, ks, D, tc, out);
      using y0 = MlxArray.fromNumbers(
        rows.map((r) => r.seq.history.at(-1)!),
        [B, 1],
        "int32",
      );
      let draftMat: MlxArray | null = null;
      const pieces: MlxArray[] = [y0];
      if (D > 0) {
        for (const d of out.drafts) {
          using d32 = mx.astype(d, "int32");
          const col = mx.reshape(d32, [B, 1]);
          out.owned.push(col);
          pieces.push(col);
        }
        draftMat = D === 1 ? pieces[1]! : mx.concatenate(pieces.slice(1), 1);
        if (D > 1) out.owned.push(draftMat);
      }
      if (K > D) {
        const pad = mx.zeros([B, K - D], "int32");
        out.owned.push(pad);
        pieces.push(pad);
      }
      const ids = pieces.length === 1 ? y0.retain() : mx.concatenate(pieces, 1);
      out.owned.push(ids);
      // Verify [y, d_0 .. d_{K-1}] of every row in one pass; position j predicts the token after d_{j-1}.
      let logits: MlxArray;
      if (drafter.needsHidden) {
        const r = this.target.forwardHidden!(ids, tc);
        hidden = r.hidden;
        logits = r.logits;
      } else logits = this.target.forward(ids, tc);
      out.owned.push(logits);
      const draftHost: number[][] = rows.map(() => []);
      if (draftMat) {
        const flat = draftMat.toFloat64Array();
        rows.forEach((_, b) => {
          for (let j = 0; j < ks[b]!; j++) draftHost[b]!.push(flat[b * D + j]!);
        });
      }
      rows.forEach((r, b) => {
        if (r.seq.done) return;
        if (!r.spec) {
          using row = mx.index(logits, mx.sl(b, b + 1), 0, ":");
          picks[b] = r.seq.pick(row);
          return;
        }
        const greedy = r.seq.sampling.temperature === 0;
        for (let j = 0; j <= ks[b]!; j++) {
          using row = mx.index(logits, mx.sl(b, b + 1), j, ":");
          const h = r.seq.needsHistory ? [...r.seq.history, ...draftHost[b]!.slice(0, j)] : r.seq.history;
          using processed = r.seq.process(row, h);
          const lp = logSoftmax(processed);
          tRows[b]!.push(lp);
          if (!greedy) pRows[b]!.push(samplingLogProbs(lp, r.seq.sampling));
        }
      });
      // Greedy rows: one argmax over all their positions, evaluated with the plain rows' picks.
      const greedyRows = rows.flatMap((r, b) => (r.spec && !r.seq.done && r.seq.sampling.temperature === 0 ? [b] : []));
      let argmaxHost: number[] = [];
      {
        using all = greedyRows.length
          ? mx.concatenate(
              greedyRows.flatMap((b) => tRows[b]!),
              0,
            )
          : null;
        using am = all ? mx.argmax(all, -1) : null;
        const plain = picks.flatMap((p) => (p ? [p.token, p.logprobs] : []));
        if (plain.length) asyncEval(...plain, ...(am ? [am] : []));
        if (am) argmaxHost = Array.from(am.toFloat64Array());
      }
      const accepted = rows.map(() => 0);
      const tokens = rows.map(() => -1);
      let at = 0;
      rows.forEach((r, b) => {
        const seq = r.seq;
        const pick = picks[b];
        if (pick) {
          picks[b] = null;
          try {
            seq.accept(pick);
          } finally {
            disposePick(pick);
          }
          return;
        }
        const sp = r.spec;
        if (!sp || seq.done) return;
        const k = ks[b]!;
        const drafted = draftHost[b]!;
        let acc: number;
        let token: number;
        if (seq.sampling.temperature === 0) {
          const t = argmaxHost.slice(at, at + k + 1);
          at += k + 1;
          acc = firstRejection(drafted.map((d, j) => d === t[j]));
          token = t[acc]!;
        } else if (k === 0) {
          using key = sp.keys!.next();
          using t = mx.random.categorical(pRows[b]![0]!, { key });
          acc = 0;
          token = t.toFloat64Array()[0]!;
        } else {
          using p = mx.concatenate(pRows[b]!, 0);
          using q = mx.concatenate(out.qRows[b]!.slice(0, k), 0);
          using dRow = mx.index(draftMat!, b, mx.sl(0, k));
          using key = sp.keys!.next();
          using rs = rejectionSample(p, q, dRow, key);
          evaluate(rs.accept, rs.candidates);
          const a = Array.from(rs.accept.toFloat64Array(), (v) => v !== 0);
          acc = firstRejection(a);
          token = rs.candidates.toFloat64Array()[acc]!;
        }
        accepted[b] = acc;
        tokens[b] = token;
        // Emit the kept drafts, then the target's token; a stop ends the request mid-round.
        for (let j = 0; j <= acc && !seq.done; j++) {
          const tok = j < acc ? drafted[j]! : token;
          using t = MlxArray.fromNumbers([tok], [1], "int32");
          seq.accept({ token: t, logprobs: tRows[b]![j]! });
        }
        sp.stats.drafted += k;
        sp.stats.accepted += acc;
        this.#onRound?.({ drafted, accepted: acc });
      });
      // Each row holds y and K drafts (padded): it keeps y and its accepted ones.
      trimRows(
        tc,
        rows.map((_, b) => K - accepted[b]!),
      );
      drafter.commit(rows, ks, accepted, tokens, draftHost, hidden);
    } finally {
      for (const p of picks) if (p) disposePick(p);
      for (const a of [...out.drafts, ...out.qRows.flat(), ...tRows.flat(), ...pRows.flat(), ...out.owned]) a.dispose();
      hidden?.dispose();
      drafter.endRound();
    }
  }
}

/**
 * A speculating request's state across rounds, one request alone or a row of a decode batch:
 * its draft tokens per round, its key stream (sampling), its counts and, with an MTP drafter,
 * the target's hidden state at its last cached token.
 */
export class SpecRow implements Disposable {
  /** MTP: the target's final-normed hidden state [1, 1, H] at the row's last cached token (null before its first verify). */
  hidden: MlxArray | null = null;
  readonly keys: KeyStream | undefined;
  readonly stats: SpeculativeStats = { drafted: 0, accepted: 0 };

  constructor(
    readonly seq: Sequence,
    readonly numDraftTokens: number,
  ) {
    const s = seq.sampling;
    this.keys = s.temperature > 0 ? new KeyStream(s.seed ?? Math.floor(Math.random() * 2 ** 31)) : undefined;
    seq.speculative = this.stats;
  }

  dispose(): void {
    this.hidden?.dispose();
    this.hidden = null;
    this.keys?.dispose();
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}

/** A row of a round: its sequence and its speculative state (null: a plain row, which drafts nothing). */
export interface RoundRow {
  readonly seq: Sequence;
  readonly spec: SpecRow | null;
}

/** Where a round's drafts go: per draft step the ids of every row [B], per row its q rows (sampling), and arrays to free after the round. */
interface DraftOut {
  drafts: MlxArray[];
  qRows: MlxArray[][];
  owned: MlxArray[];
}

/** What proposes a round's drafts. */
interface RoundDrafter {
  /** The verify pass must return the target's hidden state (MTP). */
  readonly needsHidden: boolean;
  /** Whether the drafter can read the target caches now (a batch ring written in place cannot be read in order). */
  ready(tc: readonly Cache[]): boolean;
  /** Drafts a row can make this round, at most `k` (MTP: 0 until its first verify). */
  limit(spec: SpecRow, k: number): number;
  /** `steps` draft steps for every row after its unfed token (row b's first ks[b] drafts count). */
  draft(rows: readonly RoundRow[], ks: readonly number[], steps: number, tc: Cache[], out: DraftOut): void;
  /** After verification: row b kept accepted[b] of its ks[b] drafts, then tokens[b]; `hidden`: the verify pass's [B, K + 1, H] (borrowed). */
  commit(
    rows: readonly RoundRow[],
    ks: readonly number[],
    accepted: readonly number[],
    tokens: readonly number[],
    drafted: number[][],
    hidden: MlxArray | null,
  ): void;
  /** End of a round, whether it completed or failed. */
  endRound(): void;
  dispose(): void;
}

/** One token from a drafter's logits row [1, V]: the request's processors, then argmax or a draw from the sampling distribution (kept in `qRows`). */
function pickDraft(seq: Sequence, row: MlxArray, hist: readonly number[], keys: KeyStream | undefined, qRows: MlxArray[]): MlxArray {
  using processed = seq.process(row, hist);
  using lp = logSoftmax(processed);
  if (!keys) return mx.argmax(lp, -1);
  const q = samplingLogProbs(lp, seq.sampling);
  qRows.push(q);
  using key = keys.next();
  return mx.random.categorical(q, { key });
}

/** A separate draft model with its own caches (one request): k single-token steps; its caches are cut back after verification. */
class ModelDraftSession implements RoundDrafter {
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

  ready(): boolean {
    return true;
  }

  limit(_spec: SpecRow, k: number): number {
    return k;
  }

  draft(rows: readonly RoundRow[], _ks: readonly number[], k: number, _tc: Cache[], out: DraftOut): void {
    if (rows.length !== 1) throw new MlxError("speculative decoding: a draft model drafts for one request at a time");
    const seq = rows[0]!.seq;
    const keys = rows[0]!.spec!.keys;
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
      const d = pickDraft(seq, row, hist, keys, out.qRows[0]!);
      out.drafts.push(d);
      const d32 = mx.astype(d, "int32");
      feed = mx.reshape(d32, [1, 1]);
      d32.dispose();
      out.owned.push(feed);
      asyncEval(d);
    }
  }

  commit(_rows: readonly RoundRow[], ks: readonly number[], acc: readonly number[], tokens: readonly number[], drafted: number[][]): void {
    const dc = this.#dc;
    const k = ks[0]!;
    const accepted = acc[0]!;
    const token = tokens[0]!;
    const draftedIds = drafted[0]!;
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
}

/**
 * A Gemma 4 MTP drafter (mlx-vlm's _mtp_rounds): no cache of its own, so it drafts for any
 * number of rows at once. Each draft step reads [target embed(token) · √hidden, h] at a fixed
 * position per row (the last token the target holds for it), with h first the target's normed
 * hidden state there (SpecRow.hidden), then the drafter's own post-projected state; it attends
 * over the target's caches as they are after the last trim.
 */
class MtpDrafter implements RoundDrafter {
  readonly needsHidden = true;

  constructor(
    readonly assistant: Gemma4Assistant,
    readonly target: GenerationEngine,
    readonly kvSource: ReadonlyMap<LayerType, number>,
  ) {}

  ready(tc: readonly Cache[]): boolean {
    // A batch ring written in place (single-token steps) is not in temporal order; the next
    // verify chunk puts it back (a single ring is read as it is: a wrapped one holds the window).
    for (const i of this.kvSource.values()) {
      const c = tc[i]!;
      if (c instanceof BatchRotatingKVCache && c.rotated) return false;
    }
    return true;
  }

  limit(spec: SpecRow, k: number): number {
    return spec.hidden ? k : 0;
  }

  /** Per layer type, a view of the target cache the drafter reads, and its mask (sliding: the last `window` tokens; a batch: each row's padding hidden). */
  #views(tc: readonly Cache[]): Map<LayerType, DrafterKv> {
    const kv = new Map<LayerType, DrafterKv>();
    try {
      for (const [type, i] of this.kvSource) {
        const c = tc[i] as KVCache | RotatingKVCache | BatchKVCache | BatchRotatingKVCache;
        const st = c.state();
        const batched = isBatchCache(c);
        // A batch's state ends with its row offsets and left padding.
        const planes = batched ? st.tensors.slice(0, -2) : [...st.tensors];
        if (batched) for (const t of st.tensors.slice(-2)) t.dispose();
        const n = planes[0]!.shape[2]!;
        const view = c.codec.view(planes, n);
        const window = this.assistant.specs.find((s) => s.type === type)!.window;
        // A rotating cache after a verify chunk holds up to window - 1 + k + 1 tokens in temporal
        // order; the query (the newest position) sees the last `window` of them (mlx-vlm's
        // bidirectional_swa_mask). A wrapped single ring holds exactly `window` tokens: no mask.
        let mask: Mask = null;
        if (batched) {
          const lp = (c as BatchCache).leftPadding;
          using r = mx.arange(n);
          using rr = mx.reshape(r, [1, 1, 1, n]);
          using lpa = MlxArray.fromNumbers(lp, [lp.length, 1, 1, 1], "int32");
          using keep = mx.greater_equal(rr, lpa);
          if (window !== null && n > window) {
            using inWindow = mx.greater_equal(rr, n - window);
            mask = mx.logical_and(keep, inWindow);
          } else mask = keep.retain();
        } else if (window !== null && n > window) {
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

  draft(rows: readonly RoundRow[], ks: readonly number[], steps: number, tc: Cache[], out: DraftOut): void {
    const model = this.target.loaded.model;
    const B = rows.length;
    const kv = this.#views(tc);
    try {
      const c0 = tc[0]!;
      const position = isBatchCache(c0)
        ? MlxArray.fromNumbers(
            c0.offsets.map((o) => o - 1),
            [B],
            "int32",
          )
        : MlxArray.scalar(c0.offset - 1, "int32");
      out.owned.push(position);
      // Greedy rows without processors: the drafter's own argmax (the centroid head skips full logits, as mlx-vlm).
      const plainArgmax = rows.every((r, b) => ks[b] === 0 || (!r.spec!.keys && r.seq.processors.length === 0));
      let tok = MlxArray.fromNumbers(
        rows.map((r) => r.seq.history.at(-1)!),
        [B, 1],
        "int32",
      );
      out.owned.push(tok);
      let h: MlxArray;
      if (B === 1) h = rows[0]!.spec!.hidden!;
      else {
        const ref = rows.find((r) => r.spec?.hidden)!.spec!.hidden!;
        using zero = mx.zeros_like(ref);
        h = mx.concatenate(
          rows.map((r) => r.spec?.hidden ?? zero),
          0,
        );
        out.owned.push(h);
      }
      for (let i = 0; i < steps; i++) {
        using emb = model.embedScaled(tok);
        using inputs = mx.concatenate([emb, h], -1);
        const r = this.assistant.step(inputs, kv, position);
        out.owned.push(r.hidden);
        h = r.hidden;
        using normed = r.normed;
        let d: MlxArray;
        if (plainArgmax) {
          using a = this.assistant.argmax(normed);
          d = mx.reshape(a, [B]);
        } else {
          using logits = this.assistant.logits(normed);
          const parts = rows.map((row, b) => {
            using lrow = mx.index(logits, mx.sl(b, b + 1), 0, ":");
            if (i >= ks[b]!) return mx.argmax(lrow, -1);
            return pickDraft(row.seq, lrow, row.seq.history, row.spec!.keys, out.qRows[b]!);
          });
          try {
            d = B === 1 ? parts[0]!.retain() : mx.concatenate(parts, 0);
          } finally {
            for (const p of parts) p.dispose();
          }
        }
        out.drafts.push(d);
        using d32 = mx.astype(d, "int32");
        tok = mx.reshape(d32, [B, 1]);
        out.owned.push(tok);
        asyncEval(d);
      }
    } finally {
      releaseViews(kv);
    }
  }

  commit(
    rows: readonly RoundRow[],
    _ks: readonly number[],
    accepted: readonly number[],
    _tokens: readonly number[],
    _d: number[][],
    hidden: MlxArray | null,
  ): void {
    if (!hidden) throw new MlxError("speculative decoding: the MTP drafter needs the verify pass's hidden state");
    rows.forEach((r, b) => {
      if (!r.spec || r.seq.done) return;
      // The next round reads the target's state at the last kept input (mlx-vlm: verify.hidden[:, accepted]).
      const a = accepted[b]!;
      using row = mx.index(hidden, mx.sl(b, b + 1), mx.sl(a, a + 1), ":");
      const next = this.target.loaded.model.finalNorm(row);
      r.spec.hidden?.dispose();
      r.spec.hidden = next;
    });
  }

  endRound(): void {}

  dispose(): void {}
}

function disposePick(p: Pick): void {
  p.token.dispose();
  p.logprobs.dispose();
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

/** Cut row b of `caches` back by counts[b]: single-sequence caches (one row) trim, a batch's trim per row; checked first for every cache. */
function trimRows(caches: Cache[], counts: readonly number[]): void {
  if (!isBatchCache(caches[0]!)) {
    trimAll(caches, counts[0]!, "target");
    return;
  }
  const batch = caches.map((c) => asBatchCache("speculative decoding", c));
  const bad = batch.find((c) => !c.canTrimRows(counts));
  if (bad) throw new MlxError(`speculative decoding: the batch cache ${bad.signature()} cannot trim its rows by [${counts.join(", ")}]`);
  for (const c of batch) c.trimRows(counts);
}

function checkDraftTokens(n: number, name: string): number {
  if (!Number.isInteger(n) || n < 0 || n > 64) throw new RequestError(`${name} must be an integer in 0..64, got ${JSON.stringify(n)}`);
  return n;
}
