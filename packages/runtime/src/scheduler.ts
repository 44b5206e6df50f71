// Continuous batching: requests join and leave the decode batch between steps. Waiting requests
// are prefilled together (one batch, right-padded chunks moved to left padding: batch-prefill.ts),
// then their batch caches join the running batch's left-padded caches (BatchKVCache /
// BatchRotatingKVCache); every decode step runs the whole batch in one forward pass, each row
// samples with its own settings, and step t+1 is built and scheduled before step t is read.
import { totalmem } from "node:os";
import { asyncEval, asyncEvalInBackground, type BackgroundJob, evaluate, memory, MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import type { BatchKVCache, Cache } from "@mlx-bun/kv-cache";
import { codecFor } from "@mlx-bun/models";
import { mergeRows, prefillChunk, takeBatchRows } from "./batch-prefill.ts";
import { type Engine, RequestError, validateRequest } from "./engine.ts";
import type { PromptCache } from "./prompt-cache.ts";
import type { SpeculativeDecoder } from "./speculative.ts";
import { type Pick, Sequence } from "./sequence.ts";
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
   * Speculative decoding (a draft model): requests with num_draft_tokens > 0 (the decoder's
   * default unless a request sets 0) run through it one at a time, the others keep batching.
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
}

/** Requests being prefilled together: their batch caches and the prompt tokens not fed yet (the last excluded). */
interface PrefillGroup {
  rows: Entry[];
  caches: Cache[];
  rest: number[][];
}

interface Entry {
  seq: Sequence;
  /** KV bytes reserved for prompt + max_tokens. */
  bytes: number;
  /** The token chosen at the last decode step, not read yet (pipelined decode); null once read. */
  next: Pick | null;
  /** With background evaluation: the pick before `next`, which the running job reads; null once read. */
  prev: Pick | null;
  /** Tokens fed to the caches beyond the accepted history (background evaluation builds two steps ahead). */
  fedAhead: number[];
  /** The stream was closed and the reservation released. */
  ended: boolean;
}

export class Scheduler {
  readonly maxBatch: number;
  readonly prefillBatch: number;
  readonly memoryBudgetBytes: number;
  #pending: Entry[] = [];
  #rows: Entry[] = [];
  #caches: Cache[] | null = null;
  #prefill: PrefillGroup | null = null;
  #running: Promise<void> | null = null;
  #closed = false;
  #reserved = 0;
  readonly promptCache: PromptCache | undefined;
  readonly speculative: SpeculativeDecoder | undefined;
  readonly stats: SchedulerStats = { prefills: 0, prefilledRequests: 0, largestPrefill: 0, decodeSteps: 0 };
  #signatures: string[] | undefined;
  /** The background job running the last decode step, and the rows whose `prev` tokens it reads (in order). */
  #job: { job: BackgroundJob; rows: Entry[] } | null = null;

  constructor(
    readonly engine: Engine,
    opts: SchedulerOptions = {},
  ) {
    this.maxBatch = opts.maxBatch ?? 16;
    if (!Number.isInteger(this.maxBatch) || this.maxBatch < 1) throw new RequestError(`maxBatch must be a positive integer, got ${this.maxBatch}`);
    this.prefillBatch = opts.prefillBatch ?? 8;
    if (!Number.isInteger(this.prefillBatch) || this.prefillBatch < 1) throw new RequestError(`prefillBatch must be a positive integer, got ${this.prefillBatch}`);
    this.memoryBudgetBytes = opts.memoryBudgetBytes ?? Math.floor(totalmem() / 2);
    this.promptCache = opts.promptCache;
    this.speculative = opts.speculative;
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
    const n = promptTokens + maxTokens;
    let total = 0;
    for (const s of model.specs.slice(0, model.firstShared)) {
      const per = codec.bytesPerToken({ batch: 1, kvHeads: s.numKvHeads, kHeadDim: s.headDim, vHeadDim: s.headDim, dtype: "bfloat16" });
      const tokens = s.window !== null ? Math.min(n, s.window + maxTokens) : this.engine.maxKvSize ? Math.min(n, this.engine.maxKvSize) : n;
      total += per * tokens;
    }
    return total;
  }

  /** Queue a request; it starts as soon as the batch and the memory budget have room (FIFO). */
  submit(req: GenerateRequest): GenerationStream {
    if (this.#closed) throw new RequestError("the scheduler is closed");
    validateRequest(req, this.engine);
    const bytes = this.bytesFor(req.promptIds.length, req.maxTokens);
    if (bytes > this.memoryBudgetBytes) {
      throw new RequestError(`the request needs ${bytes} bytes of KV cache, more than the budget of ${this.memoryBudgetBytes}`);
    }
    if (this.speculative && this.speculative.draftTokensFor(req) > 0) return this.speculative.generate(req);
    const seq = new Sequence(req, this.engine.loaded.tokenizer);
    this.#pending.push({ seq, bytes, next: null, prev: null, fedAhead: [], ended: false });
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
          if (this.engine.backgroundEval && this.#rows.every((r) => !r.seq.needsHistory)) this.#decodeStepInBackground();
          else {
            this.#drainJob();
            this.#decodeStep();
          }
        }
        this.#admit();
        if (this.#prefill) this.#prefillWork();
        await yieldToEventLoop();
      }
      // The last step's job (its rows all ended): join it, so its error (if any) is this loop's.
      this.#drainJob();
    } catch (e) {
      // A fault of the batch step: every running and waiting request gets the error.
      this.#job = null;
      for (const r of [...this.#rows, ...(this.#prefill?.rows ?? []), ...this.#pending]) this.#end(r, e);
      this.#rows = [];
      this.#pending = [];
      this.#dropPrefill();
      this.#dropCaches();
      this.#reserved = 0;
    }
  }

  /** Form a prefill group from waiting requests (FIFO) while the batch and the budget have room; one group at a time. */
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
      this.#pending.shift();
      this.#reserved += e.bytes;
      group.push(e);
    }
    if (!group.length) return;
    this.stats.prefills++;
    this.stats.prefilledRequests += group.length;
    this.stats.largestPrefill = Math.max(this.stats.largestPrefill, group.length);
    try {
      const rows = group.map((e) => {
        const prompt = e.seq.req.promptIds;
        const hit = this.promptCache?.lookup(prompt, { signatures: this.#cacheSignatures() }) ?? null;
        e.seq.cachedTokens = hit?.cachedTokens ?? 0;
        return hit ? hit.caches : this.engine.makeCaches();
      });
      try {
        // All prompt tokens but the last go through the batched prefill; the last picks the first token.
        this.#prefill = { rows: group, caches: mergeRows(rows), rest: group.map((e) => e.seq.req.promptIds.slice(e.seq.cachedTokens, -1)) };
      } finally {
        for (const r of rows) for (const c of r) c.dispose();
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
      this.#splitGroup(g, (r) => r.seq.req.signal?.aborted === true, (rows, caches) => {
        for (const c of caches) c.dispose();
        for (const r of rows) {
          r.seq.cancel();
          this.#end(r);
        }
      });
      const done = (r: Entry): boolean => g.rest[g.rows.indexOf(r)]!.length === 0;
      const start = (rows: Entry[], caches: Cache[]): void => void ready.push({ rows, caches });
      if (this.#prefill) this.#splitGroup(g, done, start);
      if (this.#prefill) {
        const step = this.engine.prefillStep;
        prefillChunk(
          this.engine,
          g.caches,
          g.rest.map((t) => t.slice(0, step)),
        );
        g.rest = g.rest.map((t) => t.slice(step));
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
    for (const p of ready) this.#startDecoding(p.rows, p.caches);
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
    for (const c of g.caches) (c as BatchKVCache).filter(keep);
    const rows = out.map((i) => g.rows[i]!);
    g.rows = keep.map((i) => g.rows[i]!);
    g.rest = keep.map((i) => g.rest[i]!);
    take(rows, caches);
  }

  /**
   * Rows whose prompt is prefilled (all but its last token, in `caches`, which this takes): one
   * forward step over the last prompt tokens picks each row's first token, then the rows that go
   * on join the decode batch.
   */
  #startDecoding(group: Entry[], caches: Cache[]): void {
    const picks: Pick[] = [];
    let keep: Entry[] = [];
    let failure: unknown;
    try {
      {
        using ids = MlxArray.fromNumbers(
          group.map((e) => e.seq.req.promptIds.at(-1)!),
          [group.length, 1],
          "int32",
        );
        using logits = this.engine.forward(ids, caches);
        group.forEach((e, i) => {
          using row = mx.index(logits, mx.sl(i, i + 1), -1, ":");
          picks.push(e.seq.pick(row));
        });
      }
      evaluate(...picks.flatMap((p) => [p.token, p.logprobs]));
      group.forEach((e, i) => {
        if (e.seq.req.signal?.aborted) e.seq.cancel();
        else e.seq.accept(picks[i]!);
      });
      keep = this.#retire(group, caches);
    } catch (err) {
      failure = err ?? new RequestError("the first decode step failed");
    } finally {
      for (const p of picks) disposePick(p);
    }
    if (failure !== undefined || !keep.length) {
      for (const c of caches) c.dispose();
      for (const e of group) this.#end(e, failure);
      return;
    }
    // A failure to join would leave the decode batch's caches inconsistent: it faults the batch (#loop).
    this.#rows.push(...keep);
    this.#join(caches);
  }

  /**
   * Rows of `rows` that finished: their caches go to the prompt cache, they leave `caches`
   * (filtered, or disposed by the caller when none is left) and their streams end. Returns the
   * rows that go on, in order.
   */
  #retire(rows: readonly Entry[], caches: Cache[]): Entry[] {
    const keep: number[] = [];
    rows.forEach((r, i) => {
      if (!r.seq.done) keep.push(i);
    });
    if (keep.length === rows.length) return [...rows];
    if (this.promptCache) this.#remember(rows, caches);
    if (keep.length) for (const c of caches) (c as BatchKVCache).filter(keep);
    for (const r of rows) if (r.seq.done) this.#end(r);
    memory.clearCache();
    return keep.map((i) => rows[i]!);
  }

  /** Append a prefilled group's batch caches to the decode batch's (or make them the decode batch's); takes ownership. */
  #join(caches: Cache[]): void {
    if (!this.#caches) {
      this.#caches = caches;
      return;
    }
    try {
      this.#caches.forEach((b, i) => (b as BatchKVCache).extend(caches[i] as BatchKVCache));
    } finally {
      for (const c of caches) c.dispose();
    }
  }

  /**
   * One decode step for every row, pipelined as mlx-lm's GenerationBatch: step t+1 is built
   * from the rows' unread step-t tokens (still on the device) and scheduled with asyncEval
   * before step t is read on the host, so reading, detokenizing and streaming overlap the next
   * evaluation. A row that finishes or is cancelled at step t drops its step-t+1 token. Rows
   * whose sampling needs the host history (penalties) read their token in the same step.
   */
  #decodeStep(): void {
    const rows = this.#rows;
    const caches = this.#caches!;
    this.stats.decodeSteps++;
    // Every row's unread token is its last (max_tokens): read without building another step.
    const last = rows.every((r) => r.next && r.seq.generated.length + 1 >= r.seq.req.maxTokens);
    const picks: Pick[] = [];
    try {
      if (!last) {
        this.#buildStep(rows, caches, picks);
        asyncEval(...picks.flatMap((p) => [p.token, p.logprobs]));
      }
      // Read step t while step t+1 evaluates (the rows own the step-t+1 picks from here).
      const prevs = rows.map((r, i) => {
        const prev = r.next;
        r.next = picks[i] ?? null;
        return prev;
      });
      picks.length = 0;
      try {
        rows.forEach((r, i) => {
          const prev = prevs[i];
          if (!prev) return;
          if (r.seq.req.signal?.aborted) r.seq.cancel();
          else if (!r.seq.done) r.seq.accept(prev);
        });
      } finally {
        for (const p of prevs) if (p) disposePick(p);
      }
      for (const r of rows) {
        if (r.seq.req.signal?.aborted) r.seq.cancel();
        if (r.seq.done || !r.next || !r.seq.needsHistory) continue;
        const p = r.next;
        r.next = null;
        try {
          evaluate(p.token, p.logprobs);
          r.seq.accept(p);
        } finally {
          disposePick(p);
        }
      }
    } finally {
      for (const p of picks) disposePick(p);
    }
    this.#retireAfterStep(rows, caches);
  }

  /**
   * One decode step with the background evaluator (docs/background-eval.md): build step t+2 from
   * the rows' unread step-t+1 tokens while the worker encodes step t+1 (job J), then join J, whose
   * worker read the step-t tokens after scheduling, accept those, and hand step t+2 to the worker
   * (reading the step-t+1 tokens). Each row thus holds up to two unread picks: `prev` (read by the
   * running job) and `next` (its output). A row that finishes at t has fed t+1 to the caches.
   */
  #decodeStepInBackground(): void {
    const rows = this.#rows;
    const caches = this.#caches!;
    this.stats.decodeSteps++;
    const unread = (r: Entry) => (r.prev ? 1 : 0) + (r.next ? 1 : 0);
    const build = rows.some((r) => r.seq.generated.length + unread(r) < r.seq.req.maxTokens);
    const picks: Pick[] = [];
    try {
      if (build) this.#buildStep(rows, caches, picks);
      this.#drainJob();
      if (build) {
        // Rows that ended at step t: what they fed beyond their history (for the prompt cache), read before the next job.
        for (const r of rows) if (r.seq.done && r.next && this.promptCache && r.seq.finishReason !== "cancelled") r.fedAhead = [r.next.token.item()];
        const reads = rows.filter((r) => r.next);
        const job = asyncEvalInBackground(
          picks.flatMap((p) => [p.token, p.logprobs]),
          reads.map((r) => r.next!.token),
        );
        this.#job = { job, rows: reads };
        rows.forEach((r, i) => {
          r.prev = r.next;
          r.next = picks[i]!;
        });
        picks.length = 0;
      } else {
        // Every row's unread token is its last: read them here.
        for (const r of rows) {
          const p = r.next;
          r.next = null;
          if (p) this.#take(r, p);
        }
      }
    } finally {
      for (const p of picks) disposePick(p);
    }
    this.#retireAfterStep(rows, caches);
  }

  /** Build one decode step for `rows` from their newest tokens (unread `next`, or the last accepted id); picks pushed in row order. */
  #buildStep(rows: readonly Entry[], caches: Cache[], picks: Pick[]): void {
    const parts = rows.map((r) => (r.next ? mx.astype(r.next.token, "int32") : MlxArray.fromNumbers([r.seq.generated.at(-1)!], [1], "int32")));
    try {
      using flat = mx.concatenate(parts, 0);
      using ids = mx.reshape(flat, [rows.length, 1]);
      using logits = this.engine.forward(ids, caches);
      rows.forEach((r, i) => {
        using row = mx.index(logits, mx.sl(i, i + 1), -1, ":");
        picks.push(r.seq.pick(row));
      });
    } finally {
      for (const p of parts) p.dispose();
    }
  }

  /** Join the running background job and accept the step-t tokens its worker read. */
  #drainJob(): void {
    const j = this.#job;
    if (!j) return;
    this.#job = null;
    const values = j.job.values();
    j.rows.forEach((r, i) => {
      const p = r.prev;
      r.prev = null;
      if (p) this.#take(r, p, values[i]);
    });
  }

  /** Accept a row's pick (its token's value already read, or read now) unless the row is over or cancelled; disposes the pick. */
  #take(r: Entry, p: Pick, value?: number): void {
    try {
      if (r.ended) return;
      if (r.seq.req.signal?.aborted) r.seq.cancel();
      else if (!r.seq.done) r.seq.accept(p, value);
    } finally {
      disposePick(p);
    }
  }

  /** After a decode step: the rows that finished leave the batch. */
  #retireAfterStep(rows: readonly Entry[], caches: Cache[]): void {
    const keep = this.#retire(rows, caches);
    if (keep.length === rows.length) return;
    this.#rows = keep;
    if (keep.length === 0) this.#dropCaches();
  }

  /** Put the caches of rows that finished (not cancelled) into the prompt cache. */
  #remember(rows: readonly Entry[], caches: readonly Cache[]): void {
    rows.forEach((r, i) => {
      if (!r.seq.done || r.seq.finishReason === "cancelled") return;
      const row = caches.map((c) => (c as BatchKVCache).extract(i));
      try {
        // A row holds the prompt and the generated tokens it was fed (the last one too when a pipelined
        // step fed it before it finished); insert keeps the ids the caches hold.
        this.promptCache!.insert([...r.seq.history, ...r.fedAhead], row);
      } finally {
        for (const c of row) c.dispose();
      }
    });
  }

  /** Release a request's reservation and close its stream (with `failure` as its error, if any). */
  #end(e: Entry, failure?: unknown): void {
    if (e.ended) return;
    e.ended = true;
    if (e.next) disposePick(e.next);
    if (e.prev) disposePick(e.prev);
    e.next = null;
    e.prev = null;
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
  }
}

function disposePick(p: Pick): void {
  p.token.dispose();
  p.logprobs.dispose();
}

function yieldToEventLoop(): Promise<void> {
  return new Promise((r) => setImmediate(r));
}
