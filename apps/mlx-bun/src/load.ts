// Resolve --model and load the runtime's Engine with the KV options.
import type { Engine } from "@mlx-bun/runtime";
import { type ResolvedModel, resolveModel } from "./model-path.ts";
import type { ModelOptions } from "./options.ts";

export interface Loaded {
  engine: Engine;
  model: ResolvedModel;
}

export async function loadEngine(o: ModelOptions, opts: { progress?: boolean } = {}): Promise<Loaded> {
  const model = await resolveModel(o.model, { progress: opts.progress ?? true });
  // Imported here so that --help and argument errors do not load the native library.
  const { Engine } = await import("@mlx-bun/runtime");
  const engine = Engine.load(model.dir, {
    kv: o.kv,
    prefillStep: o.prefillStepSize,
    ...(o.maxKvSize !== undefined ? { maxKvSize: o.maxKvSize } : {}),
  });
  return { engine, model };
}
