// The decode pipeline, for one row or many (docs/runtime.md, "Decode pipeline"): build step t+1
// from the rows' unread step-t tokens, hand it to the evaluator, read step t, accept or finish
// rows. Plain mode evaluates with asyncEval on this thread; background mode hands each step to
// MLX's encoding on a native worker (docs/background-eval.md). The scheduler decides which rows
// run a step; this file owns the forward pass, the pipelining and the reads.
import { asyncEval, asyncEvalInBackground, type BackgroundJob, evaluate, MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import type { Cache } from "@mlx-bun/kv-cache";
import type { Pick, Sequence } from "./sequence.ts";
import type { RoundRow, SpecRow } from "./speculative.ts";

/** The forward step a runner drives (an Engine). */
export interface StepForward {
  forward(ids: MlxArray, caches: Cache[]): MlxArray;
}

/** A request in the decode pipeline: its sequence and the picks chosen on the device but not read yet. */
export class Row {
  /** The token chosen at the last step, not read yet; null once read. */
  next: Pick | null = null;
  /** Background mode: the pick before `next`, which the running job reads; null once read. */
  prev: Pick | null = null;
  /** Tokens fed to the caches beyond the accepted history (background mode builds two steps ahead). */
  fedAhead: number[] = [];
  /** A speculating row's state (speculative.ts), owned by the row; null for a plain row. */
  spec: SpecRow | null = null;

  constructor(readonly seq: Sequence) {}

  /** Drop the unread picks and the speculative state (the row ended). */
  release(): void {
    for (const p of [this.next, this.prev]) if (p) disposePick(p);
    this.next = null;
    this.prev = null;
    this.spec?.dispose();
    this.spec = null;
  }
}

export function disposePick(p: Pick): void {
  p.token.dispose();
  p.logprobs.dispose();
}

/** Speculative rounds over a decode batch (SpeculativeDecoder.round): one verify/accept round for every row. */
export interface SpeculativeRounds {
  round(rows: readonly RoundRow[], caches: Cache[]): void;
}

export interface RunnerOptions {
  /** Background evaluation (rows whose sampling reads the host history run plain steps). */
  background: boolean;
  /**
   * The caches go to the prompt cache when rows end: feed every row's last token too, and record
   * the ids of tokens fed but not accepted (the entry is keyed by what the caches hold).
   */
  trackFed?: boolean;
  /** Rows with a `spec` state speculate: while one is in the batch, a step is a speculative round of every row. */
  speculative?: SpeculativeRounds;
}

export class DecodeRunner {
  readonly background: boolean;
  readonly trackFed: boolean;
  readonly speculative: SpeculativeRounds | undefined;
  /** Decode steps run. */
  steps = 0;
  /** The background job of the last step, and the rows whose `prev` tokens it reads (in order). */
  #job: { job: BackgroundJob; rows: Row[] } | null = null;

  constructor(
    readonly model: StepForward,
    opts: RunnerOptions,
  ) {
    this.background = opts.background;
    this.trackFed = opts.trackFed ?? false;
    this.speculative = opts.speculative;
  }

  /**
   * The first step of rows whose prompts are in `caches` but for the last token: forward those
   * tokens and choose each row's first token, left unread in `row.next` (the next step reads it).
   */
  start(rows: readonly Row[], caches: Cache[]): void {
    const picks: Pick[] = [];
    try {
      using ids = MlxArray.fromNumbers(
        rows.map((r) => r.seq.req.promptIds.at(-1)!),
        [rows.length, 1],
        "int32",
      );
      this.#forward(rows, ids, caches, picks, null);
      rows.forEach((r, i) => (r.next = picks[i]!));
      picks.length = 0;
    } finally {
      for (const p of picks) disposePick(p);
    }
    const arrays = rows.flatMap((r) => [r.next!.token, r.next!.logprobs]);
    if (!this.#backgroundFor(rows)) asyncEval(...arrays);
    // With a job running, the first picks stay lazy: the next step's job evaluates them.
    else if (!this.#job) this.#job = { job: asyncEvalInBackground(arrays), rows: [] };
  }

  /** One decode step for every row of `caches`, in row order. Rows that end stay in `rows` (the caller retires them). */
  async step(rows: readonly Row[], caches: Cache[]): Promise<void> {
    this.steps++;
    if (this.speculative && rows.some((r) => r.spec && !r.seq.done)) await this.#stepSpeculative(rows, caches, this.speculative);
    else if (this.#backgroundFor(rows)) this.#stepInBackground(rows, caches);
    else {
      this.drain();
      await this.#stepPlain(rows, caches);
    }
  }

  /** Join the running background job and accept the tokens its worker read. */
  drain(): void {
    const j = this.#job;
    if (!j) return;
    this.#job = null;
    const values = j.job.values();
    j.rows.forEach((r, i) => {
      const p = r.prev;
      r.prev = null;
      if (p) take(r, p, values[i]);
    });
  }

  /** Forget the running job (after a fault: its rows were failed). */
  abandon(): void {
    this.#job = null;
  }

  /**
   * A speculative round of every row (speculative.ts): the rows' unread tokens are read first
   * (the round feeds each row's last accepted token with its drafts), processors with
   * asynchronous work run, then one verify pass serves every row; plain rows take one token from
   * it. Nothing stays unread after a round: a later plain step feeds the last accepted ids.
   */
  async #stepSpeculative(rows: readonly Row[], caches: Cache[], rounds: SpeculativeRounds): Promise<void> {
    this.drain();
    for (const r of rows) {
      if (r.seq.done) continue;
      const p = r.next;
      r.next = null;
      if (p) take(r, p);
      else if (r.seq.req.signal?.aborted) r.seq.cancel();
      // The caches hold every accepted id but the last (no pipelined step fed one ahead).
      r.fedAhead = [];
    }
    const waiting = rows.filter((r) => !r.seq.done && r.seq.advances);
    if (waiting.length) await Promise.all(waiting.map((r) => r.seq.advance()));
    if (rows.every((r) => r.seq.done)) return;
    rounds.round(rows, caches);
  }

  #backgroundFor(rows: readonly Row[]): boolean {
    return this.background && rows.every((r) => !r.seq.needsHistory);
  }

  /**
   * Plain pipelining, as mlx-lm's generate_step and GenerationBatch: step t+1 is built from the
   * rows' unread step-t tokens (still on the device) and scheduled with asyncEval before step t
   * is read on the host. A row that finishes or is cancelled at step t drops its step-t+1 token.
   * Rows whose processors read the history (penalties, grammars) keep step t+1's forward pass in
   * the pipeline and sample once token t is read (as vLLM applies grammar bitmasks).
   */
  async #stepPlain(rows: readonly Row[], caches: Cache[]): Promise<void> {
    // Every row's unread token is its last (max_tokens): read without building another step, unless
    // the caches go to the prompt cache (then they hold that token too, as mlx-lm's batch caches do).
    const last = !this.trackFed && rows.every((r) => r.next && r.seq.generated.length + 1 >= r.seq.req.maxTokens);
    const picks: (Pick | null)[] = [];
    const deferred: (MlxArray | null)[] = [];
    // Rows that ended in the drain() of a background job (the batch just left background mode)
    // are still in the batch, so this step feeds them once more: their caches then hold that id too.
    if (this.trackFed && !last) {
      for (const r of rows) if (r.seq.done && r.seq.finishReason !== "cancelled") r.fedAhead = [r.next ? r.next.token.item() : r.seq.generated.at(-1)!];
    }
    try {
      if (!last) {
        this.#build(rows, caches, picks, deferred);
        asyncEval(...picks.flatMap((p) => (p ? [p.token, p.logprobs] : [])), ...deferred.filter((l) => l !== null));
      }
      // Read step t while step t+1 evaluates (the rows own the step-t+1 picks from here).
      const prevs = rows.map((r, i) => {
        const prev = r.next;
        r.next = picks[i] ?? null;
        return prev;
      });
      picks.length = 0;
      rows.forEach((r, i) => {
        const p = prevs[i];
        if (p) take(r, p);
      });
      // Token t is in the history now: the deferred rows choose token t+1 (after their processors' async work).
      const waiting = rows.filter((r, i) => deferred[i] && !r.seq.done && r.seq.advances);
      if (waiting.length) await Promise.all(waiting.map((r) => r.seq.advance()));
      rows.forEach((r, i) => {
        const logits = deferred[i];
        if (!logits || r.seq.done) return;
        r.next = r.seq.pick(logits);
        asyncEval(r.next.token, r.next.logprobs);
      });
    } finally {
      for (const p of picks) if (p) disposePick(p);
      for (const l of deferred) l?.dispose();
    }
  }

  /**
   * Background pipelining: build step t+2 from the rows' unread step-t+1 tokens while the worker
   * encodes step t+1 (job J), then join J, whose worker read the step-t tokens after scheduling,
   * accept those, and hand step t+2 to the worker (reading the step-t+1 tokens). Each row thus
   * holds up to two unread picks: `prev` (read by the running job) and `next` (its output).
   */
  #stepInBackground(rows: readonly Row[], caches: Cache[]): void {
    const unread = (r: Row) => (r.prev ? 1 : 0) + (r.next ? 1 : 0);
    // With trackFed, one step past the last token feeds it to the caches (see #stepPlain).
    const extra = this.trackFed ? 1 : 0;
    const build = rows.some((r) => r.seq.generated.length + unread(r) < r.seq.req.maxTokens + extra);
    const picks: (Pick | null)[] = [];
    try {
      if (build) this.#build(rows, caches, picks);
      this.drain();
      if (build) {
        // Rows that ended at step t fed their step-t+1 token too: read it before the next job.
        if (this.trackFed) for (const r of rows) if (r.seq.done && r.next && r.seq.finishReason !== "cancelled") r.fedAhead = [r.next.token.item()];
        const reads = rows.filter((r) => r.next);
        const job = asyncEvalInBackground(
          picks.flatMap((p) => [p!.token, p!.logprobs]),
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
          if (p) take(r, p);
        }
      }
    } finally {
      for (const p of picks) if (p) disposePick(p);
    }
  }

  /**
   * Build one decode step for `rows` from their newest tokens (unread `next`, else the last
   * accepted id). Picks go to `picks` in row order; with `deferred`, rows whose processors read
   * the history leave a null pick and their logits row [1, V] there instead.
   */
  #build(rows: readonly Row[], caches: Cache[], picks: (Pick | null)[], deferred: (MlxArray | null)[] | null = null): void {
    if (rows.length === 1) {
      // One row feeds its device token as mlx-lm's `y[None]` (the sampler's uint32 ids, no cast).
      const r = rows[0]!;
      using ids = r.next ? mx.expand_dims(r.next.token, 0) : MlxArray.fromNumbers([r.seq.generated.at(-1)!], [1, 1], "int32");
      this.#forward(rows, ids, caches, picks, deferred);
      return;
    }
    const parts = rows.map((r) => (r.next ? mx.astype(r.next.token, "int32") : MlxArray.fromNumbers([r.seq.generated.at(-1)!], [1], "int32")));
    try {
      using flat = mx.concatenate(parts, 0);
      using ids = mx.reshape(flat, [rows.length, 1]);
      this.#forward(rows, ids, caches, picks, deferred);
    } finally {
      for (const p of parts) p.dispose();
    }
  }

  /** Forward ids [B, L]; each row picks from its last position (or defers: see #build). */
  #forward(rows: readonly Row[], ids: MlxArray, caches: Cache[], picks: (Pick | null)[], deferred: (MlxArray | null)[] | null): void {
    using logits = this.model.forward(ids, caches);
    rows.forEach((r, i) => {
      const row = rows.length === 1 ? mx.index(logits, ":", -1, ":") : mx.index(logits, mx.sl(i, i + 1), -1, ":");
      if (deferred && r.seq.needsHistory) {
        picks.push(null);
        deferred.push(row);
        return;
      }
      deferred?.push(null);
      try {
        picks.push(r.seq.pick(row));
      } finally {
        row.dispose();
      }
    });
  }
}

/** Accept a row's pick (its token's value already read, or read now) unless the row is over or cancelled; disposes the pick. */
function take(r: Row, p: Pick, value?: number): void {
  try {
    if (r.seq.req.signal?.aborted) r.seq.cancel();
    else if (!r.seq.done) r.seq.accept(p, value);
  } finally {
    disposePick(p);
  }
}
