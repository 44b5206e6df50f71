// What a request may ask of an engine, checked before it is queued; errors name the field.
import { MlxError } from "@mlx-bun/mlx-ffi";
import type { GenerateRequest } from "./types.ts";

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
    throw new RequestError(
      `prompt (${req.promptIds.length} tokens) plus max_tokens (${req.maxTokens}) exceeds the model's context of ${engine.maxContext} tokens`,
    );
  }
  if (req.cacheCheckpoints !== undefined && (!Array.isArray(req.cacheCheckpoints) || req.cacheCheckpoints.some((c) => !Number.isInteger(c) || c < 0))) {
    throw new RequestError(`cacheCheckpoints must be non-negative integers (prompt lengths), got ${JSON.stringify(req.cacheCheckpoints)}`);
  }
  if (req.logitsProcessors !== undefined && (!Array.isArray(req.logitsProcessors) || req.logitsProcessors.some((p) => typeof p?.process !== "function"))) {
    throw new RequestError("logitsProcessors must be an array of objects with a process(history, logits) method");
  }
  if (req.logitsProcessors?.some((p) => p.advance !== undefined && p.readsHistory === false)) {
    throw new RequestError("logitsProcessors: a processor with advance() reads the history (readsHistory cannot be false)");
  }
  if (req.logprobs !== undefined && (!Number.isInteger(req.logprobs) || req.logprobs < 0 || req.logprobs > 20)) {
    throw new RequestError(`top_logprobs must be an integer in 0..20, got ${req.logprobs}`);
  }
}
