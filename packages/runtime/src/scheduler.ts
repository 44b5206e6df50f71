// Continuous batching: the scheduler decides which requests run each decode step (admission by
// memory budget, joins, cancellation); the runner (runner.ts) runs the step. Waiting requests are
// prefilled together (right-padded chunks moved to left padding: batch-prefill.ts), then their
// batch caches join the running batch's (BatchCache). A request admitted while nothing decodes
// runs on single-sequence caches, exactly as mlx-lm's generate_step, until another joins it.
import { totalmem } from "node:os";
import { memory } from "@mlx-bun/mlx-ffi";
import { asBatchCache, type Cache, mergeRows, takeBatchRows } from "@mlx-bun/kv-cache";
import { codecFor } from "@mlx-bun/models";
import { yieldToEventLoop } from "./async.ts";
import { prefillChunk } from "./batch-prefill.ts";
import { checkImages, hasImages, type ImageCacheKeys, imageCacheKeys, imagesIn, prefillImages } from "./images.ts";
import type { GenerationEngine, PrefillProgress, RunOptions } from "./engine-contract.ts";
import { type PromptCache, PromptCacheError } from "./prompt-cache.ts";
import { RequestError, validateRequest } from "./request.ts";
import { DecodeRunner, Row } from "./runner.ts";
import { Sequence } from "./sequence.ts";
import type { SpeculativeDecoder } from "./speculative.ts";
import type { GenerateRequest, GenerationStream } from "./types.ts";

export interface SchedulerOptions {
  /** Most requests decoding at once (default 16). */
  maxBatch?: number;
  /** Most waiting requests prefilled together in one batch (default 8, mlx-lm's prefill_batch_size). */
  prefillBatch?: number;
  /** KV bytes the running requests may reserve together (default: half the machine's memory). */
  memoryBudgetBytes?: number;
  /**
   * Reuse cached prompt prefixes: a new request starts from the longest usable prefix in this
   * cache, and a finished request's caches are added to it (the scheduler does not own it).
   */
  promptCache?: PromptCache;
  /**
   * Speculative decoding: requests with num_draft_tokens > 0 (the decoder's default unless a
   * request sets 0) speculate inside the batch with an MTP drafter (docs/speculative.md), or run
   * through the decoder one at a time with a draft model; the others keep batching.
   */
  speculative?: SpeculativeDecoder;
}

/** Counters of the scheduler's work since it was made. */
export interface SchedulerStats {
  /** Batched prefills run (one per admitted group of waiting requests). */
  prefills: number;
  /** Requests prefilled (summed over the batched prefills). */
  prefilledRequests: number;
  /** Most requests prefilled together in one batch. */
  largestPrefill: number;
  /** Decode steps run over the decode batch. */
  decodeSteps: number;
  /** Finished rows whose caches the prompt cache refused (their token ids did not match the caches): not kept, nothing else affected. */
  promptCacheSkipped?: number;
}

/** Options of one submitted request beyond the request itself (its prefill progress). */
export type SubmitOptions = RunOptions;

/**
 * Requests being prefilled together: their caches (batched, or one row's single-sequence caches
 * when `solo`) and the prompt tokens not fed yet (the last excluded).
 */
interface PrefillGroup {
  rows: Entry[];
  caches: Cache[];
  rest: number[][];
  solo: boolean;
}

/** A request in the scheduler: its decode row, its KV reservation and its prefill progress. */
class Entry extends Row {
  /** The stream was closed and the reservation released. */
  ended = false;
  /** Prompt tokens fed by the prefill (of `seq.req.promptIds.length - seq.cachedTokens`). */
  prefilled = 0;
  /** Prompt lengths to keep in the prompt cache (the request's cacheCheckpoints inside the prompt, ascending). */
  readonly checkpoints: number[];
  /** The ids the prompt cache keys this prompt by: its token ids, or an image prompt's key ids (images.ts). */
  readonly keys: readonly number[];

  constructor(
    seq: Sequence,
    /** KV bytes reserved for prompt + max_tokens. */
    readonly bytes: number,
    readonly onPrefill: PrefillProgress | undefined,
    /** An image prompt's prompt-cache keys (with a prompt cache), else null. */
    readonly imageKeys: ImageCacheKeys | null = null,
  ) {
    super(seq);
    const n = seq.req.promptIds.length;
    this.keys = imageKeys?.keys ?? seq.req.promptIds;
    // An image prompt's snapshots lie where a reused prefix may end (never inside an image's run:
    // a prefill chunk holds whole images; on a bidirectional model, none before its last image).
    const cut = imageKeys?.cut ?? ((c: number) => c);
    this.checkpoints = [...new Set(seq.req.cacheCheckpoints ?? [])].filter((c) => c > 0 && c < n - 1 && cut(c) === c).sort((a, b) => a - b);
  }
}

/**
 * Requests that never speculate: those whose processors do asynchronous work per token (the draft
 * rounds are synchronous) and image prompts (prefilled with their images in one chunk).
 */
function decodesPlainly(req: GenerateRequest): boolean {
  return hasImages(req) || (req.logitsProcessors?.some((p) => p.advance) ?? false);
}

export class Scheduler {
  readonly maxBatch: number;
  readonly prefillBatch: number;
  readonly memoryBudgetBytes: number;
  readonly promptCache: PromptCache | undefined;
  readonly speculative: SpeculativeDecoder | undefined;
  readonly stats: SchedulerStats = { prefills: 0, prefilledRequests: 0, largestPrefill: 0, decodeSteps: 0 };
  readonly #runner: DecodeRunner;
  #pending: Entry[] = [];
  #rows: Entry[] = [];
  /** The decode rows' caches: batched, or the one row's single-sequence caches when #solo. */
  #caches: Cache[] | null = null;
  #solo = false;
  #prefill: PrefillGroup | null = null;
  #running: Promise<void> | null = null;
  #closed = false;
  #reserved = 0;
  #signatures: string[] | undefined;

  constructor(
    readonly engine: GenerationEngine,
    opts: SchedulerOptions = {},
  ) {
    this.maxBatch = opts.maxBatch ?? 16;
    if (!Number.isInteger(this.maxBatch) || this.maxBatch < 1) throw new RequestError(`maxBatch must be a positive integer, got ${this.maxBatch}`);
    this.prefillBatch = opts.prefillBatch ?? 8;
    if (!Number.isInteger(this.prefillBatch) || this.prefillBatch < 1)
      throw new RequestError(`prefillBatch must be a positive integer, got ${this.prefillBatch}`);
    this.memoryBudgetBytes = opts.memoryBudgetBytes ?? Math.floor(totalmem() / 2);
    if (!(this.memoryBudgetBytes > 0)) throw new RequestError(`memoryBudgetBytes must be positive, got ${this.memoryBudgetBytes}`);
    this.promptCache = opts.promptCache;
    this.speculative = opts.speculative;
    this.#runner = new DecodeRunner(engine, {
      background: engine.backgroundEval,
      trackFed: this.promptCache !== undefined,
      ...(this.speculative?.batches ? { speculative: this.speculative } : {}),
    });
  }

  /** Per-layer signatures of this engine's caches (prompt-cache entries must match them). */
  #cacheSignatures(): string[] {
    if (!this.#signatures) {
      const cs = this.engine.makeCaches();
      this.#signatures = cs.map((c) => c.signature());
      for (const c of cs) c.dispose();
    }
    return this.#signatures;
  }

  /** Requests running, being prefilled or waiting. */
  get active(): number {
    return this.#rows.length + (this.#prefill?.rows.length ?? 0) + this.#pending.length;
  }

  /** Requests in the decode batch now. */
  get batchSize(): number {
    return this.#rows.length;
  }

  /** KV bytes a request reserves: each owning layer's bytes per token × the tokens it can hold. */
  bytesFor(promptTokens: number, maxTokens: number): number {
    const model = this.engine.loaded.model;
    const codec = codecFor(this.engine.kvMode);
    const sliding = this.engine.kvSlidingMode ? codecFor(this.engine.kvSlidingMode) : codec;
    const n = promptTokens + maxTokens;
    let total = 0;
    for (const s of model.specs.slice(0, model.firstShared)) {
      const per = (s.type === "sliding_attention" ? sliding : codec).bytesPerToken({
        batch: 1,
        kvHeads: s.numKvHeads,
        kHeadDim: s.headDim,
        vHeadDim: s.headDim,
        dtype: "bfloat16",
      });
      const tokens = s.window !== null ? Math.min(n, s.window + maxTokens) : this.engine.maxKvSize ? Math.min(n, this.engine.maxKvSize) : n;
      total += per * tokens;
    }
    return total;
  }

  /** Queue a request; it starts as soon as the batch and the memory budget have room (FIFO). */
  submit(req: GenerateRequest, opts: SubmitOptions = {}): GenerationStream {
    if (this.#closed) throw new RequestError("the scheduler is closed");
    validateRequest(req, this.engine);
    checkImages(req, this.engine);
    const bytes = this.bytesFor(req.promptIds.length, req.maxTokens);
    if (bytes > this.memoryBudgetBytes) {
      throw new RequestError(`the request needs ${bytes} bytes of KV cache, more than the budget of ${this.memoryBudgetBytes}`);
    }
    // With an MTP drafter, speculating requests decode in the batch beside the others (docs/speculative.md).
    const k = this.#batchDraftTokens(req);
    if (k > 0) return this.#enqueue(req, this.bytesFor(req.promptIds.length, req.maxTokens + k), opts, k);
    if (this.speculative && this.speculative.draftTokensFor(req) > 0 && !decodesPlainly(req)) return this.speculative.generate(req, opts);
    const seq = new Sequence(req, this.engine.loaded.tokenizer);
    const keys = this.promptCache && hasImages(req) ? imageCacheKeys(req, this.engine) : null;
    this.#pending.push(new Entry(seq, bytes, opts.onPrefill, keys));
    this.#running ??= this.#loop().finally(() => {
      this.#running = null;
    });
    return seq.channel;
  }

  /**
   * Draft tokens per round of a request that speculates inside the batch (an MTP drafter), else 0.
   */
  #batchDraftTokens(req: GenerateRequest): number {
    const sd = this.speculative;
    if (!sd?.batches || decodesPlainly(req)) return 0;
    return sd.draftTokensFor(req);
  }

  /** Queue a request that speculates in the batch with `k` draft tokens per round. */
  #enqueue(req: GenerateRequest, bytes: number, opts: SubmitOptions, k: number): GenerationStream {
    const seq = new Sequence(req, this.engine.loaded.tokenizer);
    const e = new Entry(seq, bytes, opts.onPrefill);
    e.spec = this.speculative!.specRow(seq, k);
    this.#pending.push(e);
    this.#running ??= this.#loop().finally(() => {
      this.#running = null;
    });
    return seq.channel;
  }

  /** Stop accepting requests and wait for the running ones. */
  async close(): Promise<void> {
    this.#closed = true;
    await this.#running;
  }

  async #loop(): Promise<void> {
    try {
      // Start on a later turn: submit() returns at once, and requests submitted together are prefilled together.
      await yieldToEventLoop();
      // As mlx-lm's BatchGenerator: a decode step, then one prefill chunk of the waiting group.
      while (this.#rows.length || this.#pending.length || this.#prefill) {
        if (this.#rows.length) {
          this.stats.decodeSteps++;
          await this.#runner.step(this.#rows, this.#caches!);
          this.#retireAfterStep();
          // As mlx-lm's generate_step: return freed buffers to the system now and then.
          if (this.stats.decodeSteps % 256 === 0) memory.clearCache();
        }
        this.#admit();
        if (this.#prefill) this.#prefillWork();
        await yieldToEventLoop();
      }
      // The last step's job (its rows all ended): join it, so its error (if any) is this loop's.
      this.#runner.drain();
    } catch (e) {
      // A fault of the batch step: every running and waiting request gets the error.
      this.#runner.abandon();
      for (const r of [...this.#rows, ...(this.#prefill?.rows ?? []), ...this.#pending]) this.#end(r, e);
      this.#rows = [];
      this.#pending = [];
      this.#dropPrefill();
      this.#dropCaches();
      this.#reserved = 0;
    }
  }

  /**
   * Form a prefill group from waiting requests (FIFO) while the batch and the budget have room;
   * one group at a time. A group of one admitted while nothing decodes runs solo (single-sequence caches).
   */
  #admit(): void {
    if (this.#prefill) return;
    const group: Entry[] = [];
    while (this.#pending.length && this.#rows.length + group.length < this.maxBatch && group.length < this.prefillBatch) {
      const e = this.#pending[0]!;
      if (e.seq.req.signal?.aborted) {
        this.#pending.shift();
        e.seq.cancel();
        this.#end(e);
        continue;
      }
      // FIFO: a request that does not fit waits for memory, and so do the ones behind it.
      if ((this.#rows.length || group.length) && this.#reserved + e.bytes > this.memoryBudgetBytes) break;
      // An image prompt is prefilled in a group of its own (images.ts).
      if (group.length && hasImages(e.seq.req)) break;
      this.#pending.shift();
      this.#reserved += e.bytes;
      group.push(e);
      if (hasImages(e.seq.req)) break;
    }
    if (!group.length) return;
    this.stats.prefills++;
    this.stats.prefilledRequests += group.length;
    this.stats.largestPrefill = Math.max(this.stats.largestPrefill, group.length);
    const solo = group.length === 1 && this.#rows.length === 0;
    try {
      const rows = group.map((e) => {
        const prompt = e.seq.req.promptIds;
        const cut = e.imageKeys?.cut;
        const hit = this.promptCache?.lookup(e.keys, { signatures: this.#cacheSignatures(), ...(cut ? { cut } : {}) }) ?? null;
        e.seq.cachedTokens = hit?.cachedTokens ?? 0;
        e.onPrefill?.(0, prompt.length - e.seq.cachedTokens);
        return hit ? hit.caches : this.engine.makeCaches();
      });
      // All prompt tokens but the last go through the prefill; the last picks the first token.
      const rest = group.map((e) => e.seq.req.promptIds.slice(e.seq.cachedTokens, -1));
      if (solo) this.#prefill = { rows: group, caches: rows[0]!, rest, solo };
      else {
        try {
          this.#prefill = { rows: group, caches: mergeRows(rows), rest, solo };
        } finally {
          for (const r of rows) for (const c of r) c.dispose();
        }
      }
    } catch (err) {
      for (const e of group) this.#end(e, err ?? new RequestError("the batched prefill failed"));
    }
  }

  /**
   * One step of the prefill group: drop cancelled rows, feed one chunk (prefillStep tokens per
   * row), and move the rows whose prompt is done to decoding (mlx-lm splits them off the same
   * way). A fault fails the group's requests only; the decode batch runs on.
   */
  #prefillWork(): void {
    const g = this.#prefill!;
    const ready: { rows: Entry[]; caches: Cache[] }[] = [];
    try {
      this.#splitGroup(
        g,
        (r) => r.seq.req.signal?.aborted === true,
        (rows, caches) => {
          for (const c of caches) c.dispose();
          for (const r of rows) {
            r.seq.cancel();
            this.#end(r);
          }
        },
      );
      const done = (r: Entry): boolean => g.rest[g.rows.indexOf(r)]!.length === 0;
      const start = (rows: Entry[], caches: Cache[]): void => void ready.push({ rows, caches });
      if (this.#prefill) this.#splitGroup(g, done, start);
      if (this.#prefill) {
        // Each row's chunk: up to prefillStep tokens, ending at its next checkpoint (mlx_lm.server's segments).
        const chunks = g.rows.map((r, i) => g.rest[i]!.slice(0, this.#chunkLength(r, g.rest[i]!.length)));
        // An image prompt (a group of its own): the images whose runs are in its chunk (none of those in a reused prefix).
        const r0 = g.rows[0]!;
        if (g.rows.length === 1 && hasImages(r0.seq.req)) {
          const fed = this.#fed(r0);
          prefillImages(this.engine, g.caches, chunks[0]!, imagesIn(this.engine, r0.seq.req, fed, fed + chunks[0]!.length));
        } else prefillChunk(this.engine, g.caches, chunks);
        g.rest = g.rest.map((t, i) => t.slice(chunks[i]!.length));
        g.rows.forEach((r, i) => {
          r.prefilled += chunks[i]!.length;
          r.onPrefill?.(r.prefilled, r.seq.req.promptIds.length - r.seq.cachedTokens);
          if (this.promptCache && chunks[i]!.length && r.checkpoints.includes(this.#fed(r))) this.#checkpoint(r, g, i);
        });
        this.#splitGroup(g, done, start);
      }
    } catch (err) {
      // The group's prefill failed (e.g. a codec that cannot hold its head dim): its requests fail.
      const failure = err ?? new RequestError("the batched prefill failed");
      for (const r of g.rows) this.#end(r, failure);
      for (const p of ready) {
        for (const r of p.rows) this.#end(r, failure);
        for (const c of p.caches) c.dispose();
      }
      if (this.#prefill === g) this.#dropPrefill();
      return;
    }
    for (const p of ready) {
      // The prompt's end (all but its last token): a later prompt extending it reuses it, wrapped window or not.
      p.rows.forEach((r, i) => {
        if (this.promptCache && this.#fed(r) > r.seq.cachedTokens) this.#checkpoint(r, { caches: p.caches, solo: g.solo }, i);
      });
      this.#startDecoding(p.rows, p.caches, g.solo);
    }
  }

  /** Prompt tokens in a prefilling row's caches. */
  #fed(r: Entry): number {
    return r.seq.cachedTokens + r.prefilled;
  }

  /** The row's next prefill chunk: at most prefillStep of its `left` tokens, ending at its next checkpoint. */
  #chunkLength(r: Entry, left: number): number {
    const fed = this.#fed(r);
    const next = this.promptCache ? r.checkpoints.find((c) => c > fed) : undefined;
    // An image prompt: split only at its checkpoints, so each image's run is in one chunk (its soft tokens go in together: images.ts).
    if (hasImages(r.seq.req)) return next === undefined ? left : Math.min(left, next - fed);
    return Math.min(this.engine.prefillStep, left, next === undefined ? left : next - fed);
  }

  /** Keep row `i` of `g`'s caches in the prompt cache under the prompt tokens they hold. */
  #checkpoint(r: Entry, g: { caches: Cache[]; solo: boolean }, i: number): void {
    const ids = r.keys.slice(0, this.#fed(r));
    if (g.solo) {
      this.promptCache!.insert(ids, g.caches);
      return;
    }
    const row = g.caches.map((c) => asBatchCache("Scheduler (checkpoint)", c).extract(i));
    try {
      this.promptCache!.insert(ids, row);
    } finally {
      for (const c of row) c.dispose();
    }
  }

  /** Take the rows of `g` that `which` selects out of it, with their caches, and hand them to `take` (which owns them). */
  #splitGroup(g: PrefillGroup, which: (r: Entry) => boolean, take: (rows: Entry[], caches: Cache[]) => void): void {
    const out: number[] = [];
    const keep: number[] = [];
    g.rows.forEach((r, i) => (which(r) ? out : keep).push(i));
    if (!out.length) return;
    if (!keep.length) {
      this.#prefill = null;
      take(g.rows, g.caches);
      return;
    }
    const caches = takeBatchRows(g.caches, out);
    for (const c of g.caches) asBatchCache("Scheduler (prefill split)", c).filter(keep);
    const rows = out.map((i) => g.rows[i]!);
    g.rows = keep.map((i) => g.rows[i]!);
    g.rest = keep.map((i) => g.rest[i]!);
    take(rows, caches);
  }

  /**
   * Rows whose prompt is prefilled (all but its last token, in `caches`, which this takes): the
   * runner's first step picks each row's first token, then the rows join the decode batch.
   */
  #startDecoding(group: Entry[], caches: Cache[], solo: boolean): void {
    let keep: Entry[] = [];
    try {
      this.#runner.start(group, caches);
      keep = this.#retire(group, caches, solo);
    } catch (err) {
      for (const c of caches) c.dispose();
      for (const e of group) this.#end(e, err ?? new RequestError("the first decode step failed"));
      return;
    }
    if (!keep.length) {
      for (const c of caches) c.dispose();
      return;
    }
    // A failure to join would leave the decode batch's caches inconsistent: it faults the batch (#loop).
    this.#rows.push(...keep);
    this.#join(caches, solo);
  }

  /**
   * Rows of `rows` that finished: their caches go to the prompt cache, they leave `caches`
   * (filtered, or disposed by the caller when none is left) and their streams end. Returns the
   * rows that go on, in order.
   */
  #retire(rows: readonly Entry[], caches: Cache[], solo: boolean): Entry[] {
    const keep: number[] = [];
    rows.forEach((r, i) => {
      if (!r.seq.done) keep.push(i);
    });
    if (keep.length === rows.length) return [...rows];
    if (this.promptCache) this.#remember(rows, caches, solo);
    if (keep.length) for (const c of caches) asBatchCache("Scheduler (retire)", c).filter(keep);
    for (const r of rows) if (r.seq.done) this.#end(r);
    memory.clearCache();
    return keep.map((i) => rows[i]!);
  }

  /** Make `caches` the decode batch's, or append them to it (a solo row's caches become a batch of one first); takes ownership. */
  #join(caches: Cache[], solo: boolean): void {
    if (!this.#caches) {
      this.#caches = caches;
      this.#solo = solo;
      return;
    }
    if (this.#solo) {
      const batch = mergeRows([this.#caches]);
      for (const c of this.#caches) c.dispose();
      this.#caches = batch;
      this.#solo = false;
    }
    try {
      const incoming = solo ? mergeRows([caches]) : caches;
      try {
        this.#caches.forEach((b, i) => asBatchCache("Scheduler (join)", b).extend(asBatchCache("Scheduler (join)", incoming[i]!)));
      } finally {
        if (incoming !== caches) for (const c of incoming) c.dispose();
      }
    } finally {
      for (const c of caches) c.dispose();
    }
  }

  /** After a decode step: the rows that finished leave the batch. */
  #retireAfterStep(): void {
    const keep = this.#retire(this.#rows, this.#caches!, this.#solo);
    if (keep.length === this.#rows.length) return;
    this.#rows = keep;
    if (keep.length === 0) this.#dropCaches();
  }

  /** Put the caches of rows that finished (not cancelled) into the prompt cache. */
  #remember(rows: readonly Entry[], caches: readonly Cache[], solo: boolean): void {
    rows.forEach((r, i) => {
      if (!r.seq.done || r.seq.finishReason === "cancelled") return;
      // A row holds the prompt (keyed by its key ids) and the generated tokens it was fed (one more
      // when a pipelined step fed it before it finished); insert keeps the ids the caches hold.
      const ids = [...r.keys, ...r.seq.history.slice(r.keys.length), ...r.fedAhead];
      // Keeping a finished row's caches is only an optimization: a refusal (ids that do not match
      // what the caches hold) costs that entry, never the requests of the batch.
      try {
        if (solo) {
          this.promptCache!.insert(ids, caches);
          return;
        }
        const row = caches.map((c) => asBatchCache("Scheduler (prompt cache)", c).extract(i));
        try {
          this.promptCache!.insert(ids, row);
        } finally {
          for (const c of row) c.dispose();
        }
      } catch (e) {
        if (!(e instanceof PromptCacheError)) throw e;
        this.stats.promptCacheSkipped = (this.stats.promptCacheSkipped ?? 0) + 1;
      }
    });
  }

  /** Release a request's reservation and close its stream (with `failure` as its error, if any). */
  #end(e: Entry, failure?: unknown): void {
    if (e.ended) return;
    e.ended = true;
    e.release();
    this.#reserved = Math.max(0, this.#reserved - e.bytes);
    if (failure !== undefined) e.seq.channel.fail(failure);
    else e.seq.finish();
    e.seq.dispose();
  }

  #dropPrefill(): void {
    if (this.#prefill) for (const c of this.#prefill.caches) c.dispose();
    this.#prefill = null;
  }

  #dropCaches(): void {
    if (this.#caches) for (const c of this.#caches) c.dispose();
    this.#caches = null;
    this.#solo = false;
  }
}
