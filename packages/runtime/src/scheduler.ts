// Continuous batching: requests join and leave the decode batch between steps. Each request is
// prefilled alone (chunked, exactly as a single generation), then its caches join the batch's
// left-padded caches (BatchKVCache / BatchRotatingKVCache); every decode step runs the whole batch
// in one forward pass, and each row samples with its own settings.
import { totalmem } from "node:os";
import { evaluate, memory, MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { BatchKVCache, BatchRotatingKVCache, type Cache, KVCache, RotatingKVCache } from "@mlx-bun/kv-cache";
import { codecFor } from "@mlx-bun/models";
import { type Engine, RequestError, validateRequest } from "./engine.ts";
import type { PromptCache } from "./prompt-cache.ts";
import { type Pick, Sequence } from "./sequence.ts";
import type { GenerateRequest, GenerationStream } from "./types.ts";

export interface SchedulerOptions {
  /** Most requests decoding at once (default 16). */
  maxBatch?: number;
  /** KV bytes the running requests may reserve together (default: half the machine's memory). */
  memoryBudgetBytes?: number;
  /**
   * Reuse cached prompt prefixes: a new request starts from the longest usable prefix in this
   * cache, and a finished request's caches are added to it (the scheduler does not own it).
   */
  promptCache?: PromptCache;
}

interface Entry {
  seq: Sequence;
  /** KV bytes reserved for prompt + max_tokens. */
  bytes: number;
}

export class Scheduler {
  readonly maxBatch: number;
  readonly memoryBudgetBytes: number;
  #pending: Entry[] = [];
  #rows: Entry[] = [];
  #caches: Cache[] | null = null;
  #running: Promise<void> | null = null;
  #closed = false;
  #reserved = 0;
  readonly promptCache: PromptCache | undefined;
  #signatures: string[] | undefined;

  constructor(
    readonly engine: Engine,
    opts: SchedulerOptions = {},
  ) {
    this.maxBatch = opts.maxBatch ?? 16;
    if (!Number.isInteger(this.maxBatch) || this.maxBatch < 1) throw new RequestError(`maxBatch must be a positive integer, got ${this.maxBatch}`);
    this.memoryBudgetBytes = opts.memoryBudgetBytes ?? Math.floor(totalmem() / 2);
    this.promptCache = opts.promptCache;
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

  /** Requests running or waiting. */
  get active(): number {
    return this.#rows.length + this.#pending.length;
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
    const seq = new Sequence(req, this.engine.loaded.tokenizer);
    this.#pending.push({ seq, bytes });
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
      while (this.#rows.length || this.#pending.length) {
        await this.#admit();
        if (this.#rows.length) this.#decodeStep();
        await yieldToEventLoop();
      }
    } catch (e) {
      // A fault of the batch step: every running and waiting request gets the error.
      for (const r of [...this.#rows, ...this.#pending]) this.#end(r, e);
      this.#rows = [];
      this.#pending = [];
      this.#dropCaches();
      this.#reserved = 0;
    }
  }

  /** Prefill waiting requests alone and add them to the batch, while there is room. */
  async #admit(): Promise<void> {
    while (this.#pending.length && this.#rows.length < this.maxBatch) {
      const e = this.#pending[0]!;
      if (e.seq.req.signal?.aborted) {
        this.#pending.shift();
        e.seq.cancel();
        this.#end(e);
        continue;
      }
      // FIFO: a request that does not fit waits for memory, and so do the ones behind it.
      if (this.#rows.length && this.#reserved + e.bytes > this.memoryBudgetBytes) return;
      this.#pending.shift();
      this.#reserved += e.bytes;
      const prompt = e.seq.req.promptIds;
      const hit = this.promptCache?.lookup(prompt, { signatures: this.#cacheSignatures() }) ?? null;
      const caches = hit ? hit.caches : this.engine.makeCaches();
      e.seq.cachedTokens = hit?.cachedTokens ?? 0;
      let joined = false;
      let failure: unknown;
      try {
        const rest = this.engine.prefill(prompt.slice(e.seq.cachedTokens), caches, 1);
        using x = MlxArray.fromNumbers(rest, [1, rest.length], "int32");
        using logits = this.engine.forward(x, caches);
        using row = mx.index(logits, ":", -1, ":");
        const p = e.seq.pick(row);
        evaluate(p.token, p.logprobs);
        e.seq.accept(p);
        disposePick(p);
        if (!e.seq.done) {
          this.#join(caches);
          this.#rows.push(e);
          joined = true;
        } else this.promptCache?.insert(prompt, caches);
      } catch (err) {
        // This request's prefill failed (e.g. a codec that cannot hold its head dim): it alone fails.
        failure = err;
      } finally {
        for (const c of caches) c.dispose();
        if (!joined) this.#end(e, failure);
      }
      await yieldToEventLoop();
    }
  }

  /** Merge one request's single-row caches into the batch caches. */
  #join(caches: Cache[]): void {
    const rows = caches.map((c) => {
      if (c instanceof KVCache) return BatchKVCache.merge([c]);
      if (c instanceof RotatingKVCache) return BatchRotatingKVCache.merge([c]);
      throw new RequestError(`cannot batch a ${c.signature()} cache`);
    });
    if (!this.#caches) {
      this.#caches = rows;
      return;
    }
    try {
      this.#caches.forEach((b, i) => (b as BatchKVCache).extend(rows[i] as BatchKVCache));
    } finally {
      for (const r of rows) r.dispose();
    }
  }

  /** One decode step for every row, then drop the rows that finished. */
  #decodeStep(): void {
    const rows = this.#rows;
    const caches = this.#caches!;
    const last = rows.map((r) => r.seq.generated.at(-1)!);
    const picks: Pick[] = [];
    try {
      using ids = MlxArray.fromNumbers(last, [rows.length, 1], "int32");
      using logits = this.engine.forward(ids, caches);
      rows.forEach((r, i) => {
        using row = mx.index(logits, mx.sl(i, i + 1), -1, ":");
        picks.push(r.seq.pick(row));
      });
      evaluate(...picks.flatMap((p) => [p.token, p.logprobs]));
      rows.forEach((r, i) => {
        if (r.seq.req.signal?.aborted) r.seq.cancel();
        else r.seq.accept(picks[i]!);
      });
    } finally {
      for (const p of picks) disposePick(p);
    }
    const keep: number[] = [];
    rows.forEach((r, i) => {
      if (!r.seq.done) keep.push(i);
    });
    if (keep.length === rows.length) return;
    const finished = rows.filter((r) => r.seq.done);
    if (this.promptCache) this.#remember(rows, caches);
    this.#rows = keep.map((i) => rows[i]!);
    if (keep.length === 0) this.#dropCaches();
    else for (const c of caches) (c as BatchKVCache).filter(keep);
    for (const f of finished) this.#end(f);
    memory.clearCache();
  }

  /** Put the caches of rows that finished (not cancelled) into the prompt cache. */
  #remember(rows: readonly Entry[], caches: readonly Cache[]): void {
    rows.forEach((r, i) => {
      if (!r.seq.done || r.seq.finishReason === "cancelled") return;
      const row = caches.map((c) => (c as BatchKVCache).extract(i));
      try {
        // The rows hold prompt + generated tokens but the last (sampled, never fed); insert drops the extra id.
        this.promptCache!.insert(r.seq.history, row);
      } finally {
        for (const c of row) c.dispose();
      }
    });
  }

  /** Release a request's reservation and close its stream (with `failure` as its error, if any). */
  #end(e: Entry, failure?: unknown): void {
    if (this.#rows.includes(e) && failure === undefined) return;
    this.#reserved = Math.max(0, this.#reserved - e.bytes);
    if (failure !== undefined) e.seq.channel.fail(failure);
    else e.seq.finish();
    e.seq.dispose();
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
