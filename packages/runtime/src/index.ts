/**
 * @mlx-bun/runtime: generation (chunked prefill, pipelined decode, sampling, stop strings,
 * streaming), continuous batching, prompt-cache reuse and KV persistence.
 */
export * from "./types.ts";
export { Engine, type EngineOptions, type PrefillProgress, RequestError, type RunOptions, validateRequest } from "./engine.ts";
export { KeyStream, logSoftmax, processLogits, type ResolvedSampling, resolveSampling, sample } from "./sampling.ts";
export { StopMatcher } from "./stop.ts";
export { EventChannel } from "./stream.ts";
export { type Pick, Sequence } from "./sequence.ts";
export { Scheduler, type SchedulerOptions } from "./scheduler.ts";
export * from "./kv-store.ts";
export * from "./prompt-cache.ts";
