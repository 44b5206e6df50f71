// Engine: a loaded model plus the single-request generation loop (chunked prefill, pipelined
// decode with async eval), in mlx-lm generate_step's order so greedy tokens match it.
import { basename } from "node:path";
import { asyncEval, asyncEvalInBackground, evaluate, memory, MlxArray, MlxError } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import type { Cache } from "@mlx-bun/kv-cache";
import { type KvMode, kvModeName, type LoadedModel, loadModel, parseKvMode } from "@mlx-bun/models";
import { type Pick, Sequence } from "./sequence.ts";
import type { StepModel } from "./distributed.ts";
import type { GenerateRequest, GenerationStream } from "./types.ts";

export interface EngineOptions {
  /** KV cache mode: bf16 | q8 | q4 | turbo:<kbits>,<vbits> (default bf16). */
  kv?: string | KvMode;
  /** Bound the full-attention caches to a rotating window of this many tokens. */
  maxKvSize?: number;
  /** Prompt tokens per prefill step (mlx-lm's prefill_step_size, default 2048). */
  prefillStep?: number;
  /** Run steps through this model instead of the loaded one (a LeaderModel for tensor-parallel ranks). */
  stepModel?: StepModel;
  /**
   * Decode with MLX's encoding of each step on a native worker thread while the next step's graph
   * is built here (docs/background-eval.md). Default: on, except on Metal (not yet measured there)
   * and with a stepModel; MLX_BUN_BACKGROUND_EVAL=0 or 1 overrides the default.
   */
  backgroundEval?: boolean;
}

/** Progress of a long prefill: tokens done of total. */
export type PrefillProgress = (done: number, total: number) => void;

/** Options of one generate call beyond the request itself. */
export interface RunOptions {
  /** Caches already holding the first `cachedTokens` prompt tokens (from the prompt cache); default fresh. */
  caches?: Cache[];
  cachedTokens?: number;
  onPrefill?: PrefillProgress;
  /** Called at the end with the caches and the token ids they hold; return true to keep them (the callee then owns them). */
  onCaches?: (caches: Cache[], tokens: number[]) => boolean;
}

export class Engine implements Disposable {
  readonly kvMode: KvMode;
  readonly prefillStep: number;
  readonly maxKvSize: number | undefined;
  readonly backgroundEval: boolean;
  #busy = false;
  readonly #model: StepModel;

  constructor(
    readonly loaded: LoadedModel,
    opts: EngineOptions = {},
  ) {
    this.kvMode = typeof opts.kv === "string" ? parseKvMode(opts.kv) : (opts.kv ?? { kind: "bf16" });
    this.prefillStep = opts.prefillStep ?? 2048;
    if (!Number.isInteger(this.prefillStep) || this.prefillStep < 1) throw new MlxError(`prefillStep must be a positive integer, got ${this.prefillStep}`);
    this.maxKvSize = opts.maxKvSize;
    this.#model = opts.stepModel ?? loaded.model;
    this.backgroundEval = opts.backgroundEval ?? (opts.stepModel ? false : defaultBackgroundEval());
  }

  static load(dir: string, opts: EngineOptions = {}): Engine {
    return new Engine(loadModel(dir), opts);
  }

  get modelName(): string {
    return basename(this.loaded.dir);
  }

  get kvModeName(): string {
    return kvModeName(this.kvMode);
  }

  /** Context length the model was trained for. */
  get maxContext(): number {
    return this.loaded.config.text.maxPositionEmbeddings;
  }

  makeCaches(): Cache[] {
    return this.#model.makeCaches(this.kvMode, this.maxKvSize ? { maxKvSize: this.maxKvSize } : {});
  }

  /** Logits [B, L, V] of a forward step. */
  forward(ids: MlxArray, caches: Cache[]): MlxArray {
    return this.#model.forward(ids, caches);
  }

  /**
   * Feed `ids` into `caches` in chunks of prefillStep, evaluating the caches after each chunk
   * (mlx-lm's prefill loop); all but the last `keep` tokens. Returns the ids not yet fed.
   */
  prefill(ids: readonly number[], caches: Cache[], keep = 1, onProgress?: PrefillProgress): number[] {
    let rest = [...ids];
    const total = ids.length;
    let done = 0;
    onProgress?.(0, total);
    while (rest.length > keep) {
      const n = Math.min(this.prefillStep, rest.length - keep);
      using x = MlxArray.fromNumbers(rest.slice(0, n), [1, n], "int32");
      using logits = this.forward(x, caches);
      // Evaluate the caches, not the logits (mlx-lm evaluates c.state).
      const planes = caches.map((c) => c.state());
      try {
        evaluate(...planes.flatMap((p) => p.tensors));
      } finally {
        for (const p of planes) p[Symbol.dispose]();
      }
      void logits;
      rest = rest.slice(n);
      done += n;
      onProgress?.(done, total);
      memory.clearCache();
    }
    return rest;
  }

  /** Generate for one request, alone (the Scheduler batches many). */
  generate(req: GenerateRequest, run: RunOptions = {}): GenerationStream {
    validateRequest(req, this);
    const seq = new Sequence(req, this.loaded.tokenizer);
    seq.cachedTokens = run.cachedTokens ?? 0;
    void this.#run(seq, run);
    return seq.channel;
  }

  async #run(seq: Sequence, run: RunOptions): Promise<void> {
    // One request at a time through the model: requests queue here (the Scheduler interleaves).
    while (this.#busy) await Bun.sleep(1);
    this.#busy = true;
    const caches = run.caches ?? this.makeCaches();
    let kept = false;
    let failure: unknown;
    // Tokens of seq.history the caches hold (a pipelined step feeds a token before it is read).
    let inCache = 0;
    try {
      const prompt = seq.req.promptIds;
      const cached = run.cachedTokens ?? 0;
      const rest = this.prefill(prompt.slice(cached), caches, 1, run.onPrefill);
      inCache = prompt.length - rest.length;
      if (this.backgroundEval && !seq.needsHistory) {
        const extra = await this.#decodeInBackground(seq, rest, caches, run.onCaches !== undefined);
        inCache += rest.length + extra.fed;
        if (run.onCaches) kept = run.onCaches(caches, [...seq.history, ...extra.unaccepted].slice(0, inCache));
        return;
      }
      let cur = this.#step(seq, rest, caches);
      inCache += rest.length;
      asyncEval(cur.token, cur.logprobs);
      for (;;) {
        await yieldToEventLoop();
        if (seq.req.signal?.aborted) seq.cancel();
        if (seq.done) {
          disposePick(cur);
          break;
        }
        let next: Pick | undefined;
        // Pipeline: feed the not-yet-read token into the next step, then read it.
        if (!seq.needsHistory && seq.generated.length + 1 < seq.req.maxTokens) {
          next = this.#stepLazy(seq, cur.token, caches);
          inCache++;
          asyncEval(next.token, next.logprobs);
        }
        seq.accept(cur);
        disposePick(cur);
        if (seq.done) {
          if (next) disposePick(next);
          break;
        }
        if (!next) {
          next = this.#step(seq, [seq.generated.at(-1)!], caches);
          inCache++;
          asyncEval(next.token, next.logprobs);
        }
        cur = next;
        if (seq.generated.length % 256 === 0) memory.clearCache();
      }
      if (run.onCaches) kept = run.onCaches(caches, seq.history.slice(0, inCache));
    } catch (e) {
      // A fault is an error of the stream, never a "cancelled" result.
      failure = e;
    } finally {
      this.#busy = false;
      if (!kept) for (const c of caches) c.dispose();
      if (failure !== undefined) seq.channel.fail(failure);
      else seq.finish();
      seq.dispose();
    }
  }

  /**
   * The decode loop with the background evaluator: while the worker encodes step t+1 (and then
   * reads token t), this thread builds step t+2; so a step costs the longer of the two, not their
   * sum. When the request ends at token t, step t+1 was computed and t+2 built but never
   * evaluated. Returns how many decoded tokens were fed to the caches and, when `wantIds`, the
   * ids of those fed but not accepted (read here, so a kept cache is keyed by what it holds).
   */
  async #decodeInBackground(seq: Sequence, rest: number[], caches: Cache[], wantIds: boolean): Promise<{ fed: number; unaccepted: number[] }> {
    const max = seq.req.maxTokens;
    let fed = 0;
    // Build the step producing token number n (1-based) only if the request may still want it.
    const build = (n: number, from: MlxArray): Pick | undefined => {
      if (n > max) return undefined;
      fed++;
      return this.#stepLazy(seq, from, caches);
    };
    let cur: Pick = this.#step(seq, rest, caches);
    asyncEvalInBackground([cur.token, cur.logprobs]);
    let next = build(2, cur.token);
    let after: Pick | undefined;
    try {
      for (;;) {
        // Hand step t+1 to the worker (it reads token t after scheduling it), build t+2 meanwhile.
        let value: number;
        if (next) {
          const job = asyncEvalInBackground([next.token, next.logprobs], [cur.token]);
          after = seq.req.signal?.aborted ? undefined : build(seq.generated.length + 3, next.token);
          await yieldToEventLoop();
          value = job.values()[0]!;
        } else {
          await yieldToEventLoop();
          value = cur.token.item();
        }
        if (seq.req.signal?.aborted) seq.cancel();
        const accepted = !seq.done;
        if (accepted) seq.accept(cur, value);
        if (seq.done) {
          // Fed but not accepted: token t when step t+1 exists and t was not accepted, token t+1 when t+2 was built.
          const unaccepted: number[] = [];
          if (wantIds) {
            if (next && !accepted) unaccepted.push(value);
            if (after) unaccepted.push(next!.token.item());
          }
          return { fed, unaccepted };
        }
        if (!next) throw new MlxError("decode ended without a stop (internal error)");
        disposePick(cur);
        cur = next;
        next = after;
        after = undefined;
        if (seq.generated.length % 256 === 0) memory.clearCache();
      }
    } finally {
      for (const p of new Set([cur, next, after])) if (p) disposePick(p);
    }
  }

  /** Forward `ids` (host) and pick from the last row. */
  #step(seq: Sequence, ids: number[], caches: Cache[]): Pick {
    using x = MlxArray.fromNumbers(ids, [1, ids.length], "int32");
    using logits = this.forward(x, caches);
    using row = mx.index(logits, ":", -1, ":");
    return seq.pick(row);
  }

  /** Forward a device token [1] without reading it (as mlx-lm's `y[None]`: the sampler's uint32 ids, no cast). */
  #stepLazy(seq: Sequence, token: MlxArray, caches: Cache[]): Pick {
    using x = mx.expand_dims(token, 0);
    using logits = this.forward(x, caches);
    using row = mx.index(logits, ":", -1, ":");
    return seq.pick(row);
  }

  dispose(): void {
    this.loaded.dispose();
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}

/** Errors of a request the caller can fix; their messages name the field. */
export class RequestError extends MlxError {
  override name = "RequestError";
}

/** What validateRequest reads of an engine (the serve worker of tensor-parallel ranks checks requests with these limits). */
export interface RequestLimits {
  readonly maxContext: number;
  readonly maxKvSize: number | undefined;
  readonly loaded: { tokenizer: { vocabSize: number } };
}

export function validateRequest(req: GenerateRequest, engine: RequestLimits): void {
  const vocab = engine.loaded.tokenizer.vocabSize;
  if (!Array.isArray(req.promptIds) || req.promptIds.length === 0) throw new RequestError("prompt is empty");
  for (const t of req.promptIds) {
    if (!Number.isInteger(t) || t < 0 || t >= vocab) throw new RequestError(`prompt token id ${t} is outside the vocabulary (0..${vocab - 1})`);
  }
  if (!Number.isInteger(req.maxTokens) || req.maxTokens < 1) throw new RequestError(`max_tokens must be a positive integer, got ${req.maxTokens}`);
  if (req.promptIds.length + req.maxTokens > engine.maxContext && !engine.maxKvSize) {
    throw new RequestError(`prompt (${req.promptIds.length} tokens) plus max_tokens (${req.maxTokens}) exceeds the model's context of ${engine.maxContext} tokens`);
  }
  if (req.logprobs !== undefined && (!Number.isInteger(req.logprobs) || req.logprobs < 0 || req.logprobs > 20)) {
    throw new RequestError(`top_logprobs must be an integer in 0..20, got ${req.logprobs}`);
  }
}

function disposePick(p: Pick): void {
  p.token.dispose();
  p.logprobs.dispose();
}

function defaultBackgroundEval(): boolean {
  const env = process.env.MLX_BUN_BACKGROUND_EVAL;
  if (env === "0" || env === "1") return env === "1";
  return mx.kernels.gpu_backend() !== "metal";
}

function yieldToEventLoop(): Promise<void> {
  return new Promise((r) => setImmediate(r));
}
