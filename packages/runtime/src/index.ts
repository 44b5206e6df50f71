/**
 * @mlx-bun/runtime: generation (chunked prefill, pipelined decode, sampling, stop strings,
 * streaming), continuous batching, prompt-cache reuse and KV persistence.
 */
export * from "./types.ts";
export { Engine, type EngineOptions, type PrefillProgress, RequestError, type RequestLimits, type RunOptions, validateRequest } from "./engine.ts";
export { KeyStream, logSoftmax, processLogits, type ResolvedSampling, resolveSampling, sample, temperedLogits } from "./sampling.ts";
export { StopMatcher } from "./stop.ts";
export { EventChannel } from "./stream.ts";
export { type Pick, Sequence } from "./sequence.ts";
export { Scheduler, type SchedulerOptions, type SchedulerStats } from "./scheduler.ts";
export { mergeRows, type PrefillModel, prefillBatch, prefillChunk, takeBatchRows } from "./batch-prefill.ts";
export { DEFAULT_NUM_DRAFT_TOKENS, SpeculativeDecoder, type SpeculativeOptions } from "./speculative.ts";
export { firstRejection, rejectionSample, type RejectionDraws, samplingLogProbs } from "./speculative-sampling.ts";
export * from "./kv-store.ts";
export * from "./prompt-cache.ts";
export { type Backend, backendAvailable, followSteps, type FollowOptions, type Group, joinGroup, LeaderModel, type StepModel, StepOp } from "./distributed.ts";
