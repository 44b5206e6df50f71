// What the scheduler and the speculative decoder need of an engine (an Engine implements it), so
// they depend on this contract, not on the Engine that is built on them.
import type { MlxArray } from "@mlx-bun/mlx-ffi";
import type { Cache } from "@mlx-bun/kv-cache";
import type { ForwardInputs, KvMode, LoadedModel, VisionEncoder } from "@mlx-bun/models";
import type { PrefillModel } from "./batch-prefill.ts";
import type { RequestLimits } from "./request.ts";
import type { GenerateRequest, GenerationStream } from "./types.ts";

/** Progress of a long prefill: tokens done of total. */
export type PrefillProgress = (done: number, total: number) => void;

/** Options of one generate call beyond the request itself. */
export interface RunOptions {
  /** Progress of its prefill: prompt tokens fed of those not served by the prompt cache. */
  onPrefill?: PrefillProgress;
}

export interface GenerationEngine extends RequestLimits, PrefillModel {
  readonly loaded: LoadedModel;
  readonly kvMode: KvMode;
  /** The sliding-window layers' KV mode when it is not kvMode (Engine: bf16 by default for a quantized kvMode). */
  readonly kvSlidingMode?: KvMode | undefined;
  /** Decode steps are encoded on a native worker (docs/background-eval.md). */
  readonly backgroundEval: boolean;
  makeCaches(): Cache[];
  /**
   * Logits and the last layer's hidden state before the final norm (Gemma4Model.forwardHidden),
   * for MTP drafters. Absent where the forward runs elsewhere (tensor-parallel ranks).
   */
  forwardHidden?(ids: MlxArray, caches: Cache[]): { hidden: MlxArray; logits: MlxArray };
  /** The vision tower (loaded on first use); null when the checkpoint has none. Absent: no images. */
  vision?(): VisionEncoder | null;
  /** A forward step with media inputs (images' soft tokens, masks): Gemma4Model.forward's `inputs`. */
  forwardWith?(ids: MlxArray, caches: Cache[], inputs: ForwardInputs): MlxArray;
  /** Feed all but the last `keep` of `ids` into `caches` in prefillStep chunks; returns the ids not fed. */
  prefill(ids: readonly number[], caches: Cache[], keep?: number, onProgress?: PrefillProgress): number[];
  /** One request alone (queued FIFO behind others). */
  generate(req: GenerateRequest, run?: RunOptions): GenerationStream;
  dispose(): void;
}
