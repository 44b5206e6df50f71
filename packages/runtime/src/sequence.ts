// One request's decoding state: sampling, history, detokenization, stop handling, events.
import type { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import type { Gemma4Tokenizer, StreamingDetokenizer } from "@mlx-bun/models";
import { applyProcessors, KeyStream, logSoftmax, type ResolvedSampling, resolveSampling, sample, samplingProcessors, xtcSpecialTokens } from "./sampling.ts";
import { StopMatcher } from "./stop.ts";
import { EventChannel } from "./stream.ts";
import type { FinishReason, GenerateRequest, GenerationEvent, LogitsProcessor, SpeculativeStats, TopLogprob } from "./types.ts";

/** A token chosen on the device, not yet read: the pipelined decode reads it one step later. */
export interface Pick {
  token: MlxArray;
  logprobs: MlxArray;
}

export class Sequence implements Disposable {
  readonly sampling: ResolvedSampling;
  /** The row's logits processors: the sampling settings' (bias, penalties), then the request's. */
  readonly processors: readonly LogitsProcessor[];
  readonly history: number[];
  readonly generated: number[] = [];
  readonly channel = new EventChannel();
  readonly stopIds: Set<number>;
  #keys: KeyStream | undefined;
  #detok: StreamingDetokenizer;
  #stop: StopMatcher;
  #t0 = performance.now();
  #tFirst = 0;
  finishReason: FinishReason | null = null;
  cachedTokens = 0;
  /** Set by the speculative decoder; reported in the result. */
  speculative: SpeculativeStats | undefined;

  constructor(
    readonly req: GenerateRequest,
    readonly tokenizer: Gemma4Tokenizer,
  ) {
    const xtc = (req.sampling?.xtcProbability ?? 0) > 0 && (req.sampling?.temperature ?? 0) > 0;
    this.sampling = resolveSampling(req.sampling, tokenizer.vocabSize, xtc ? xtcSpecialTokens(tokenizer) : []);
    this.processors = [...samplingProcessors(this.sampling), ...(req.logitsProcessors ?? [])];
    this.history = [...req.promptIds];
    this.stopIds = new Set([...tokenizer.eosTokenIds, ...(req.stopTokenIds ?? [])]);
    if (this.sampling.temperature > 0)
      this.#keys = new KeyStream(this.sampling.seed ?? Math.floor(Math.random() * 2 ** 31), this.sampling.seed !== undefined ? this.sampling.seedSkip : 0);
    this.#detok = tokenizer.streamDecoder({ skipSpecialTokens: req.keepSpecialTokens !== true });
    this.#stop = new StopMatcher(req.stop ?? []);
  }

  /** Processors that read the host history (penalties, grammars) need each token read before the next step: no pipelining. */
  get needsHistory(): boolean {
    return this.processors.some((p) => p.readsHistory !== false);
  }

  /** Whether a processor has asynchronous work per step (LogitsProcessor.advance). */
  get advances(): boolean {
    return this.processors.some((p) => p.advance !== undefined);
  }

  /** Run the processors' asynchronous work for the current history. */
  async advance(): Promise<void> {
    for (const p of this.processors) await p.advance?.(this.history);
  }

  get done(): boolean {
    return this.finishReason !== null;
  }

  /** The row's logits processors over one logits row [1, V], with `history` (default: the accepted ids). */
  process(row: MlxArray, history: readonly number[] = this.history): MlxArray {
    return applyProcessors(row, history, this.processors);
  }

  /** Choose the next token from one logits row [1, V] (lazy). */
  pick(row: MlxArray): Pick {
    using processed = this.process(row);
    const logprobs = logSoftmax(processed);
    // The request's key stream: XTC's coin (when on), then the categorical draw, as mlx-lm.
    const token = sample(logprobs, this.sampling, this.#keys);
    return { token, logprobs };
  }

  /** Take the evaluated pick: record, stream, and decide whether the request is over. `token`: its value when already read (by the background evaluator). */
  accept(p: Pick, token: number = p.token.item()): void {
    if (this.#tFirst === 0) this.#tFirst = performance.now();
    this.generated.push(token);
    this.history.push(token);
    const ev: GenerationEvent = { token, text: "" };
    if (this.req.logprobs !== undefined) {
      using lp = mx.index(p.logprobs, 0, token);
      ev.logprob = lp.item();
      const n = this.req.logprobs;
      if (n > 0) ev.topLogprobs = topLogprobs(p.logprobs, n);
    }
    if (this.stopIds.has(token)) {
      this.finishReason = "stop";
      ev.text = this.#drain();
    } else {
      const r = this.#stop.push(this.#detok.add(token));
      ev.text = r.text;
      if (r.stopped) this.finishReason = "stop";
      else {
        if (this.generated.length >= this.req.maxTokens) this.finishReason = "length";
        else if (this.req.signal?.aborted) this.finishReason = "cancelled";
        if (this.finishReason) ev.text += this.#drain();
      }
    }
    this.channel.push(ev);
  }

  /** Text held back (an unfinished character, a possible stop-string prefix) at the end. */
  #drain(): string {
    const r = this.#stop.push(this.#detok.finalize());
    if (r.stopped) this.finishReason = "stop";
    return r.stopped ? r.text : r.text + this.#stop.flush();
  }

  cancel(): void {
    if (!this.finishReason) this.finishReason = "cancelled";
  }

  /** Close the stream with the result. */
  finish(): void {
    const now = performance.now();
    this.channel.finish({
      tokens: [...this.generated],
      text: this.#stop.text,
      finishReason: this.finishReason ?? "cancelled",
      promptTokens: this.req.promptIds.length,
      cachedTokens: this.cachedTokens,
      ttft: ((this.#tFirst || now) - this.#t0) / 1000,
      decodeSeconds: (now - (this.#tFirst || now)) / 1000,
      ...(this.speculative ? { speculative: { ...this.speculative } } : {}),
    });
  }

  dispose(): void {
    this.#keys?.dispose();
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}

function topLogprobs(lp: MlxArray, n: number): TopLogprob[] {
  const row = lp.toFloat64Array();
  const idx = Array.from(row.keys());
  idx.sort((a, b) => row[b]! - row[a]!);
  return idx.slice(0, n).map((token) => ({ token, logprob: row[token]! }));
}
