// Resolve --model and load the runtime's Engine with the KV options, a LoRA adapter (--adapter-path)
// and mlx_lm's quantized-KV flags (--kv-bits, --kv-group-size, --quantized-kv-start).
import { createHash } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import type { KvMode } from "@mlx-bun/models";
import type { Engine, EngineOptions, SpeculativeDecoder } from "@mlx-bun/runtime";
import { type ResolvedModel, resolveModel } from "./model-path.ts";
import { type DraftOptions, type ModelOptions, UsageError } from "./options.ts";

export interface Loaded {
  engine: Engine;
  model: ResolvedModel;
}

/** Engine options from the flags (and the KV modes a prompt-cache file asks for, when --kv / --kv-sliding are not given). */
export function engineOptions(o: ModelOptions, fileKv?: { kv?: KvMode; kvSliding?: KvMode; quantizedKv?: EngineOptions["quantizedKv"] }): EngineOptions {
  if (o.kvBits !== undefined && o.kv !== undefined && o.kv !== "bf16") {
    throw new UsageError(`--kv-bits quantizes a bf16 cache from --quantized-kv-start on; it does not combine with --kv ${o.kv}`);
  }
  const opts: EngineOptions = { kv: o.kv ?? fileKv?.kv ?? "bf16", prefillStep: o.prefillStepSize };
  if (o.kvWindow !== undefined) opts.maxKvSize = o.kvWindow;
  if (o.kvSliding !== undefined) {
    if (o.kvBits !== undefined) throw new UsageError("--kv-sliding does not combine with --kv-bits (which leaves the sliding layers bf16 already)");
    opts.kvSliding = o.kvSliding;
  } else if (fileKv?.kvSliding) opts.kvSliding = fileKv.kvSliding; // a file whose sliding layers were quantized
  if (o.kvBits !== undefined) opts.quantizedKv = { bits: o.kvBits, groupSize: o.kvGroupSize ?? 64, start: o.quantizedKvStart ?? 5000 };
  else if (fileKv?.quantizedKv && o.kv === undefined) opts.quantizedKv = fileKv.quantizedKv;
  return opts;
}

/** Notes for flags that are accepted for mlx_lm's sake but change nothing here (stderr, once). */
export function noteNoOps(o: ModelOptions, say: (line: string) => void = (l) => process.stderr.write(`${l}\n`)): void {
  if (o.maxKvSize !== undefined) {
    say(
      "mlx-bun: --max-kv-size has no effect on Gemma 4, as in mlx_lm (the model's own caches win: sliding layers keep their window, full-attention layers grow); --kv-window n bounds the full-attention layers",
    );
  }
}

/**
 * --exact: MLX's own kernels only (mlx-ops' MLX_BUN_FAST_QMV / MLX_BUN_EXACT_NORMS / MLX_BUN_SDPA_DECODE off), set before the
 * model loads: the kernels are chosen at first use, and the settings pass to processes this one starts.
 */
export function exactKernels(o: Pick<ModelOptions, "exact">, env: NodeJS.ProcessEnv = process.env): void {
  if (o.exact) Object.assign(env, { MLX_BUN_FAST_QMV: "off", MLX_BUN_EXACT_NORMS: "off", MLX_BUN_SDPA_DECODE: "off" });
}

export async function loadEngine(
  o: ModelOptions,
  opts: { progress?: boolean; fileKv?: Parameters<typeof engineOptions>[1]; model?: ResolvedModel } = {},
): Promise<Loaded> {
  const engineOpts = engineOptions(o, opts.fileKv);
  exactKernels(o);
  const model = opts.model ?? (await resolveModel(o.model, { progress: opts.progress ?? true }));
  // Imported here so that --help and argument errors do not load the native library.
  const { Engine } = await import("@mlx-bun/runtime");
  // Started by `mlx-bun launch`: one rank of a tensor-parallel group (docs/distributed.md).
  const rank = await import("./launch/rank.ts");
  const backend = rank.launchedBackend();
  if (backend) {
    if (o.pipeline)
      throw new UsageError(
        "--pipeline: mlx-bun splits Gemma 4 tensor-parallel across `mlx-bun launch` ranks; pipeline parallelism is not implemented (drop --pipeline)",
      );
    if (o.adapterPath) throw new UsageError("--adapter-path: adapters are not supported across ranks (as mlx_lm's distributed mode)");
    if (engineOpts.quantizedKv) throw new UsageError("--kv-bits: quantizing the KV cache mid-generation is not supported across ranks (use --kv q8 or q4)");
    return { engine: rank.loadRankEngine(model.dir, backend, engineOpts), model };
  }
  const engine = Engine.load(model.dir, engineOpts);
  // What the load worked around (e.g. a missing tokenizer_config.json): said once, at start-up.
  for (const w of engine.loaded.warnings ?? []) process.stderr.write(`mlx-bun: warning: ${w}\n`);
  try {
    if (o.adapterPath) await applyAdapter(engine, o.adapterPath);
  } catch (e) {
    engine.dispose();
    throw e;
  }
  return { engine, model };
}

/**
 * Apply the LoRA adapter in `dir` (mlx_lm's format) to the engine's model; the model fingerprint
 * then also covers the adapter, so a prompt cache saved with it is not taken for the base model's.
 */
/** Per engine, the LoRA layers its adapter added (mlx_lm's LoRALinear draws two keys each: see mlx-lm-seed.ts). */
export const adapterLayers = new WeakMap<Engine, number>();

export async function applyAdapter(engine: Engine, dir: string): Promise<void> {
  if (!existsSync(dir)) throw new UsageError(`--adapter-path ${dir}: no such directory`);
  const { loadAdapter } = await import("@mlx-bun/models");
  const adapter = loadAdapter(engine.loaded.model, dir);
  adapterLayers.set(engine, adapter.modules.length);
  const h = createHash("sha256").update(engine.loaded.fingerprint);
  h.update(readFileSync(join(dir, "adapter_config.json")));
  h.update(readFileSync(join(dir, "adapters.safetensors")));
  engine.loaded.fingerprint = h.digest("hex").slice(0, 32);
  const dispose = engine.dispose.bind(engine);
  engine.dispose = () => {
    adapter.dispose();
    dispose();
  };
}

/**
 * The drafter of speculative decoding (--draft-model), or undefined without one: a draft model
 * (loaded with the target's KV options) or a Gemma 4 MTP drafter (config.json model_type
 * gemma4_assistant, which reads the target's hidden state and K/V; docs/speculative.md).
 * Vocabulary, shape and cache checks happen here, at start-up. --num-draft-tokens defaults to 3,
 * an MTP drafter's to its block_size - 1.
 */
export async function loadDraft(o: ModelOptions & DraftOptions, target: Engine, opts: { progress?: boolean } = {}): Promise<SpeculativeDecoder | undefined> {
  if (!o.draftModel) return undefined;
  const model = await resolveModel(o.draftModel, { progress: opts.progress ?? true });
  const { Engine, SpeculativeDecoder } = await import("@mlx-bun/runtime");
  const { isAssistantDir, loadAssistant } = await import("@mlx-bun/models");
  const draft = isAssistantDir(model.dir)
    ? loadAssistant(model.dir)
    : Engine.load(model.dir, { ...engineOptions(o), kv: target.kvMode, ...(target.quantizedKv ? { quantizedKv: target.quantizedKv } : {}) });
  try {
    return new SpeculativeDecoder(target, draft, o.numDraftTokens === undefined ? {} : { numDraftTokens: o.numDraftTokens });
  } catch (e) {
    draft.dispose();
    throw e;
  }
}
