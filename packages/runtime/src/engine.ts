// Engine: a loaded model, its KV mode and forward step, and generation of one request at a time
// through a one-row Scheduler (the same decode pipeline as the server's batches; runner.ts).
import { basename } from "node:path";
import { MlxError, type MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { type Cache, KVCache, plainCodec, QuantizeAfterKVCache } from "@mlx-bun/kv-cache";
import {
  checkKvMode,
  type ForwardInputs,
  type KvMode,
  kvModeKey,
  kvModeName,
  type LoadedModel,
  loadModel,
  loadVisionEncoder,
  parseKvMode,
  type VisionEncoder,
} from "@mlx-bun/models";
import { prefillChunk } from "./batch-prefill.ts";
import type { StepModel } from "./distributed.ts";
import type { GenerationEngine, PrefillProgress, RunOptions } from "./engine-contract.ts";
import { Scheduler } from "./scheduler.ts";
import type { GenerateRequest, GenerationStream } from "./types.ts";

export interface EngineOptions {
  /**
   * KV cache mode: bf16 | q8 | q4 | turbo:<kbits>,<vbits> (default bf16). A quantized mode applies
   * to the full-attention layers; the sliding-window layers keep the model's dtype unless
   * `kvSliding` says otherwise (as mlx-lm and mlx-vlm, which leave RotatingKVCache unquantized).
   */
  kv?: string | KvMode;
  /**
   * KV cache mode of the sliding-window layers (default: bf16, i.e. the model's dtype; `kv` when
   * that is bf16). Their caches hold at most a window of tokens, so quantizing them saves little
   * memory and costs an encode per layer per step (on an H200, 40 sliding layers of a 12B-shaped
   * model at 8k context: turbo:4,3 decodes 33.9 tok/s with them quantized, 61.5 with them bf16).
   * Give a mode (e.g. "turbo:4,3") to quantize them too.
   */
  kvSliding?: string | KvMode;
  /** Bound the full-attention caches to a rotating window of this many tokens. */
  maxKvSize?: number;
  /** Prompt tokens per prefill step (mlx-lm's prefill_step_size, default 2048). */
  prefillStep?: number;
  /**
   * mlx-lm's kv_bits / kv_group_size / quantized_kv_start: each bf16 full-attention cache
   * (KVCache) turns affine-quantized once it holds `start` tokens (QuantizeAfterKVCache). Needs
   * `kv` bf16. Sliding-window caches stay bf16 (mlx-lm's RotatingKVCache cannot be quantized: it
   * raises NotImplementedError there). Such caches do not batch: use them one request at a time.
   */
  quantizedKv?: { bits: number; groupSize: number; start: number };
  /** Run steps through this model instead of the loaded one (a LeaderModel for tensor-parallel ranks). */
  stepModel?: StepModel;
  /**
   * Decode with MLX's encoding of each step on a native worker thread while the next step's graph
   * is built here (docs/background-eval.md). Default: on, except on Metal (not yet measured there)
   * and with a stepModel; MLX_BUN_BACKGROUND_EVAL=0 or 1 overrides the default.
   */
  backgroundEval?: boolean;
}

export class Engine implements GenerationEngine, Disposable {
  readonly kvMode: KvMode;
  /**
   * The sliding-window layers' KV mode when it differs from kvMode (bf16 by default when kvMode
   * is quantized); undefined when it is the same or the model has no sliding-attention layers.
   */
  readonly kvSlidingMode: KvMode | undefined;
  readonly prefillStep: number;
  readonly maxKvSize: number | undefined;
  readonly quantizedKv: { bits: number; groupSize: number; start: number } | undefined;
  readonly backgroundEval: boolean;
  readonly #model: StepModel;
  /** generate(): one request at a time, queued FIFO. */
  #alone: Scheduler | undefined;
  /** The vision tower: undefined until first asked for, null when the checkpoint has none. */
  #vision: VisionEncoder | null | undefined;

  constructor(
    readonly loaded: LoadedModel,
    opts: EngineOptions = {},
  ) {
    this.kvMode = typeof opts.kv === "string" ? parseKvMode(opts.kv) : (opts.kv ?? { kind: "bf16" });
    const sliding = typeof opts.kvSliding === "string" ? parseKvMode(opts.kvSliding) : opts.kvSliding;
    this.kvSlidingMode = effectiveSlidingMode(this.kvMode, sliding, loaded.config.text.layerTypes.includes("sliding_attention"));
    this.prefillStep = opts.prefillStep ?? 2048;
    if (!Number.isInteger(this.prefillStep) || this.prefillStep < 1) throw new MlxError(`prefillStep must be a positive integer, got ${this.prefillStep}`);
    this.maxKvSize = opts.maxKvSize;
    this.quantizedKv = opts.quantizedKv;
    if (this.quantizedKv && this.kvMode.kind !== "bf16") throw new MlxError(`quantizedKv (kv_bits) needs the bf16 KV mode, not ${kvModeName(this.kvMode)}`);
    if (this.quantizedKv) new QuantizeAfterKVCache(this.quantizedKv.start, this.quantizedKv.bits, this.quantizedKv.groupSize).dispose(); // checks the settings now
    // A KV mode the model's head dims cannot take fails here, at start-up, not on every request.
    // With a sliding-layer mode of its own, `kv` holds the full-attention layers only.
    checkKvMode(this.kvMode, loaded.config, this.kvSlidingMode ? { layers: "full_attention" } : {});
    if (this.kvSlidingMode)
      checkKvMode(this.kvSlidingMode, loaded.config, { layers: "sliding_attention", what: `--kv-sliding ${kvModeName(this.kvSlidingMode)}` });
    if (this.quantizedKv) {
      const q = this.quantizedKv;
      checkKvMode({ kind: "affine", bits: q.bits, groupSize: q.groupSize }, loaded.config, {
        layers: "full_attention",
        what: `--kv-bits ${q.bits} --kv-group-size ${q.groupSize}`,
      });
    }
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
    return kvModeName(this.kvMode) + (this.kvSlidingMode ? ` (sliding layers ${kvModeName(this.kvSlidingMode)})` : "");
  }

  /** Context length the model was trained for. */
  get maxContext(): number {
    return this.loaded.config.text.maxPositionEmbeddings;
  }

  makeCaches(): Cache[] {
    const caches = this.#model.makeCaches(this.kvMode, {
      ...(this.maxKvSize ? { maxKvSize: this.maxKvSize } : {}),
      ...(this.kvSlidingMode ? { slidingMode: this.kvSlidingMode } : {}),
    });
    const q = this.quantizedKv;
    if (!q) return caches;
    return caches.map((c) => {
      if (!(c instanceof KVCache) || c.codec !== plainCodec) return c;
      c.dispose();
      return new QuantizeAfterKVCache(q.start, q.bits, q.groupSize);
    });
  }

  /** Logits [B, L, V] of a forward step. */
  forward(ids: MlxArray, caches: Cache[]): MlxArray {
    return this.#model.forward(ids, caches);
  }

  /** The checkpoint's vision tower, loaded on first use (the engine owns it); null when it has none. */
  vision(): VisionEncoder | null {
    if (this.#vision === undefined) {
      if (this.#model !== this.loaded.model)
        throw new MlxError("images: this engine runs its steps through another model (tensor parallel), which takes no images");
      this.#vision = loadVisionEncoder(this.loaded.dir, this.loaded.config);
    }
    return this.#vision;
  }

  /** Logits [B, L, V] of a forward step with media inputs (images' soft tokens and masks); the loaded model only. */
  forwardWith(ids: MlxArray, caches: Cache[], inputs: ForwardInputs): MlxArray {
    if (this.#model !== this.loaded.model)
      throw new MlxError("images: this engine runs its steps through another model (tensor parallel), which takes no images");
    return this.loaded.model.forward(ids, caches, inputs);
  }

  /** Logits and the pre-norm hidden state of a forward step (MTP drafters read it); the loaded model only. */
  forwardHidden(ids: MlxArray, caches: Cache[]): { hidden: MlxArray; logits: MlxArray } {
    if (this.#model !== this.loaded.model)
      throw new MlxError("forwardHidden: this engine runs its steps through another model (tensor parallel); MTP drafters need the loaded model");
    return this.loaded.model.forwardHidden(ids, caches);
  }

  /**
   * Feed `ids` into `caches` in chunks of prefillStep, evaluating the caches after each chunk
   * (mlx-lm's prefill loop); all but the last `keep` tokens. Returns the ids not yet fed.
   */
  prefill(ids: readonly number[], caches: Cache[], keep = 1, onProgress?: PrefillProgress): number[] {
    const total = ids.length;
    let done = 0;
    onProgress?.(0, total);
    while (total - done > keep) {
      const n = Math.min(this.prefillStep, total - done - keep);
      prefillChunk(this, caches, [ids.slice(done, done + n)]);
      done += n;
      onProgress?.(done, total);
    }
    return ids.slice(done);
  }

  /** Generate for one request; concurrent calls queue and run one at a time (a Scheduler batches many). */
  generate(req: GenerateRequest, run: RunOptions = {}): GenerationStream {
    this.#alone ??= new Scheduler(this, { maxBatch: 1, prefillBatch: 1, memoryBudgetBytes: Number.POSITIVE_INFINITY });
    return this.#alone.submit(req, run);
  }

  dispose(): void {
    this.#vision?.dispose();
    this.#vision = undefined;
    this.loaded.dispose();
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}

/**
 * The sliding layers' mode, undefined when it is kvMode's: `explicit` when given, else bf16 for a
 * quantized kvMode (the references keep RotatingKVCache unquantized: mlx-lm's to_quantized raises,
 * mlx-vlm's TurboQuant skips it; quantizing ≤ window tokens saves little and slows every step).
 */
function effectiveSlidingMode(kvMode: KvMode, explicit: KvMode | undefined, hasSliding: boolean): KvMode | undefined {
  if (!hasSliding) return undefined;
  const m = explicit ?? { kind: "bf16" };
  return kvModeKey(m) === kvModeKey(kvMode) ? undefined : m;
}

function defaultBackgroundEval(): boolean {
  const env = process.env.MLX_BUN_BACKGROUND_EVAL;
  if (env === "0" || env === "1") return env === "1";
  return mx.kernels.gpu_backend() !== "metal";
}
