/**
 * @mlx-bun/runtime: generation (chunked prefill, one pipelined decode path for one row or many,
 * sampling and logits processors, stop strings, streaming), continuous batching, prompt-cache
 * reuse and KV persistence.
 */
export type {
  FinishReason,
  GenerateRequest,
  GenerationEvent,
  GenerationResult,
  GenerationStream,
  LogitsProcessor,
  SamplingParams,
  SpeculativeStats,
  TopLogprob,
} from "./types.ts";
export { Engine, type EngineOptions } from "./engine.ts";
export type { GenerationEngine, PrefillProgress, RunOptions } from "./engine-contract.ts";
export { RequestError, type RequestLimits, validateRequest } from "./request.ts";
export {
  checkStructuredFormat,
  type GrammarProcessor,
  type GrammarProcessorOptions,
  type GrammarSource,
  grammarProcessor,
  grammarVocabulary,
  maskLogits,
  type StructuredFormat,
  StructuredOutputCompiler,
  type ToolCallFormat,
  toolCallProcessor,
} from "./structured-output.ts";
export { type GrammarMarks, gemma4ToolCallEbnf, ToolGrammarError, type ToolSpec } from "./tool-call-grammar.ts";
export { canonicalJson, FORMAT_PATTERNS, type PreparedSchema, prepareJsonSchema, sanitizePattern, SchemaError } from "./json-schema-support.ts";
export { Mutex, yieldToEventLoop } from "./async.ts";
export {
  applyProcessors,
  KeyStream,
  logSoftmax,
  processLogits,
  type ResolvedSampling,
  resolveSampling,
  sample,
  samplingProcessors,
  temperedLogits,
} from "./sampling.ts";
export { banTokens, maskIds } from "./constraints.ts";
export { StopMatcher } from "./stop.ts";
export { EventChannel } from "./stream.ts";
export { type Pick, Sequence } from "./sequence.ts";
export { DecodeRunner, Row, type RunnerOptions, type StepForward } from "./runner.ts";
export { Scheduler, type SchedulerOptions, type SchedulerStats, type SubmitOptions } from "./scheduler.ts";
export { type PrefillModel, prefillBatch, prefillChunk } from "./batch-prefill.ts";
export {
  checkImages,
  hasImages,
  type ImageCacheKeys,
  imageCacheKeys,
  type ImageEngine,
  type ImageInput,
  imageRuns,
  imagesIn,
  prefillImages,
} from "./images.ts";
export { DEFAULT_NUM_DRAFT_TOKENS, type Drafter, SpeculativeDecoder, type SpeculativeOptions } from "./speculative.ts";
export { firstRejection, rejectionSample, type RejectionDraws, samplingLogProbs } from "./speculative-sampling.ts";
export {
  KV_STORE_FORMAT,
  KV_STORE_VERSION,
  KvStoreError,
  type KvStoreInfo,
  type KvStoreLayer,
  type KvStoreTensor,
  type KvStoreVerification,
  type LayerShape,
  loadPromptCache,
  type LoadedPromptCache,
  type LoadPromptCacheOptions,
  readPromptCacheInfo,
  removeStaleTemps,
  removeStaleTempsIn,
  savePromptCache,
  type SavePromptCacheInfo,
  type SavePromptCacheInput,
  verifyPromptCache,
} from "./kv-store.ts";
export {
  copyCaches,
  emptyCachesLike,
  type LookupOptions,
  PromptCache,
  type PromptCacheEntryInfo,
  PromptCacheError,
  type PromptCacheHit,
  type PromptCacheOptions,
  type PromptCacheStats,
} from "./prompt-cache.ts";
export { type Backend, backendAvailable, followSteps, type FollowOptions, type Group, joinGroup, LeaderModel, type StepModel, StepOp } from "./distributed.ts";
