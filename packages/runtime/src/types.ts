// The request/response shapes shared by the generator, the scheduler and the app.
import type { MlxArray } from "@mlx-bun/mlx-ffi";
import type { PreprocessedImage } from "@mlx-bun/models";

/** Sampling settings of one request (OpenAI / mlx_lm.server names in the comments). */
export interface SamplingParams {
  /** temperature; 0 = greedy (default 0). */
  temperature?: number;
  /** top_p nucleus mass in (0, 1] (default 1 = off). */
  topP?: number;
  /** top_k; 0 = off. */
  topK?: number;
  /** min_p relative to the top probability; 0 = off. */
  minP?: number;
  /** min_tokens_to_keep: min-p keeps at least this many of the most likely tokens (default 1). */
  minTokensToKeep?: number;
  /** repetition_penalty (> 0; 1 = off), over the last `penaltyContext` tokens. */
  repetitionPenalty?: number;
  /** presence_penalty (OpenAI), over the last `penaltyContext` tokens. */
  presencePenalty?: number;
  /** frequency_penalty (OpenAI), over the last `penaltyContext` tokens. */
  frequencyPenalty?: number;
  /** Tokens the penalties look back over (mlx-lm's repetition_context_size, default 20). */
  penaltyContext?: number;
  /** logit_bias: token id → additive bias. */
  logitBias?: Record<number, number>;
  /**
   * xtc_probability in [0, 1]: the chance, per token, that XTC ("exclude top choices") runs
   * (mlx-lm's make_sampler; default 0 = off). Only when sampling (temperature > 0).
   */
  xtcProbability?: number;
  /**
   * xtc_threshold in [0, 0.5] (default 0.1): when XTC runs, every token with probability above
   * the threshold is removed except the least likely of them; the tokenizer's newline ("\n") and
   * eos ids are never removed (mlx_lm.generate's and mlx_lm.server's xtc_special_tokens).
   */
  xtcThreshold?: number;
  /** seed: same seed + same settings → same tokens. */
  seed?: number;
  /**
   * Keys of the seed's stream to pass over before the first draw (default 0). mlx_lm.generate
   * seeds MLX's global key stream before it builds the model, whose random initialization takes
   * one key per Linear / Embedding: skipping as many reproduces its seeded draws.
   */
  seedSkip?: number;
}

/**
 * A per-row logits processor (mlx-lm's logits_processors): runs after the sampling settings' own
 * (logit bias, penalties) and before sampling, for every step of the row, alone or batched.
 */
export interface LogitsProcessor {
  /**
   * Logits [1, V] of the row's next token → processed logits [1, V] (a new array, owned by the
   * caller; `logits` is borrowed). `history` is the prompt and the generated ids so far.
   */
  process(history: readonly number[], logits: MlxArray): MlxArray;
  /**
   * Whether `process` reads `history` (default true): such a row reads each token before its next
   * step is built, so it is not pipelined.
   */
  readonly readsHistory?: boolean;
  /**
   * Asynchronous work for `history` before `process` is called with it (e.g. a grammar matcher's
   * next-token mask), awaited by the scheduler between reading a step and sampling the next; a
   * processor with it reads the history. Not called before the first token: have the initial
   * state ready when the processor is made. Speculative decoding does not run such requests.
   */
  advance?(history: readonly number[]): Promise<void>;
}

/** One generation request. */
export interface GenerateRequest {
  /** Prompt token ids (already templated). */
  promptIds: number[];
  /** max_tokens (>= 1). */
  maxTokens: number;
  sampling?: SamplingParams;
  /**
   * Keep special tokens in the streamed text (as mlx_lm.server does: Gemma 4's tool-call and
   * thinking delimiters are special tokens, and its output parser needs them). Default false.
   */
  keepSpecialTokens?: boolean;
  /** Stop strings: generation ends before the first occurrence; the text never includes it. */
  stop?: string[];
  /** Extra stop token ids (the model's eos ids always stop). */
  stopTokenIds?: number[];
  /** Return log-probabilities with this many top alternatives (0 = the chosen token only; undefined = none). */
  logprobs?: number;
  /**
   * Prompt lengths at which a scheduler with a prompt cache keeps a snapshot of the caches (e.g.
   * where the conversation history ends and the generation prompt starts), so a later prompt that
   * extends that prefix reuses it even after a sliding window wrapped. The prompt's end (all but
   * its last token) is always kept.
   */
  cacheCheckpoints?: number[];
  /** Extra logits processors of this request, in order (after logit bias and penalties). */
  logitsProcessors?: LogitsProcessor[];
  /** Abort: the request stops at the next step and frees its cache row. */
  signal?: AbortSignal;
  /**
   * Speculative decoding (num_draft_tokens): draft tokens per round where a draft model is
   * loaded (default: the server's or decoder's setting); 0 = plain decoding for this request.
   */
  numDraftTokens?: number;
  /**
   * Images of the prompt, in order (preprocessed: @mlx-bun/models' preprocessImage). The prompt
   * holds each image's soft-token run already (expandImageTokens). Such a request is prefilled
   * in a group of its own, its images in one chunk, and skips speculative decoding; the prompt
   * cache keys it by the images' content (images.ts imageCacheKeys).
   */
  images?: PreprocessedImage[];
}

/** Speculative decoding counts of one request: drafted tokens and how many the target kept. */
export interface SpeculativeStats {
  drafted: number;
  accepted: number;
}

export interface TopLogprob {
  token: number;
  logprob: number;
}

/** One streamed step: a token and the text it completed (UTF-8-safe: never half a character). */
export interface GenerationEvent {
  token: number;
  /** Text delta (may be "" while a multi-byte character or a possible stop string is pending). */
  text: string;
  logprob?: number;
  topLogprobs?: TopLogprob[];
}

export type FinishReason = "stop" | "length" | "cancelled";

/** The end of a request. */
export interface GenerationResult {
  tokens: number[];
  text: string;
  finishReason: FinishReason;
  promptTokens: number;
  /** Prompt tokens served from the prompt cache instead of prefilled. */
  cachedTokens: number;
  /** Seconds: time to first token, and decode time for the rest. */
  ttft: number;
  decodeSeconds: number;
  /** Set when the request was decoded speculatively; acceptance rate = accepted / drafted. */
  speculative?: SpeculativeStats;
}

/** A running request: iterate its events; `result` resolves when it ends. */
export interface GenerationStream extends AsyncIterable<GenerationEvent> {
  readonly result: Promise<GenerationResult>;
}
