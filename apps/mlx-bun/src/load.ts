// Resolve --model and load the runtime's Engine with the KV options.
import type { Engine, SpeculativeDecoder } from "@mlx-bun/runtime";
import { type ResolvedModel, resolveModel } from "./model-path.ts";
import type { DraftOptions, ModelOptions } from "./options.ts";

export interface Loaded {
  engine: Engine;
  model: ResolvedModel;
}

export async function loadEngine(o: ModelOptions, opts: { progress?: boolean } = {}): Promise<Loaded> {
  const model = await resolveModel(o.model, { progress: opts.progress ?? true });
  // Imported here so that --help and argument errors do not load the native library.
  const { Engine } = await import("@mlx-bun/runtime");
  const engineOpts = {
    kv: o.kv,
    prefillStep: o.prefillStepSize,
    ...(o.maxKvSize !== undefined ? { maxKvSize: o.maxKvSize } : {}),
  };
  // Started by `mlx-bun launch`: one rank of a tensor-parallel group (docs/distributed.md).
  const rank = await import("./launch/rank.ts");
  const backend = rank.launchedBackend();
  if (backend) return { engine: rank.loadRankEngine(model.dir, backend, engineOpts), model };
  const engine = Engine.load(model.dir, engineOpts);
  return { engine, model };
}

/**
 * The draft model of speculative decoding (--draft-model), loaded with the target's KV options,
 * or undefined without one. Vocabulary and cache checks happen here, at start-up.
 */
export async function loadDraft(o: ModelOptions & DraftOptions, target: Engine, opts: { progress?: boolean } = {}): Promise<SpeculativeDecoder | undefined> {
  if (!o.draftModel) return undefined;
  const model = await resolveModel(o.draftModel, { progress: opts.progress ?? true });
  const { Engine, SpeculativeDecoder } = await import("@mlx-bun/runtime");
  const draft = Engine.load(model.dir, { kv: o.kv, prefillStep: o.prefillStepSize, ...(o.maxKvSize !== undefined ? { maxKvSize: o.maxKvSize } : {}) });
  try {
    return new SpeculativeDecoder(target, draft, { numDraftTokens: o.numDraftTokens });
  } catch (e) {
    draft.dispose();
    throw e;
  }
}
