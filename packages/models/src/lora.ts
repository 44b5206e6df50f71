// LoRA adapters in mlx-lm's format (adapter_config.json + adapters.safetensors; tuner/utils.py
// load_adapters): lora_a / lora_b per linear layer, applied as y + (scale · (x @ a) @ b).
import { existsSync } from "node:fs";
import { join } from "node:path";
import { loadSafetensors, type MlxArray } from "@mlx-bun/mlx-ffi";
import { readJson } from "./config.ts";
import { WeightsError } from "./errors.ts";
import type { Gemma4Model } from "./model/gemma4.ts";

export interface LoadedAdapter extends Disposable {
  /** Module paths that got an adapter. */
  modules: string[];
  scale: number;
  rank: number;
  /** Remove the adapter from the model and free its tensors. */
  dispose(): void;
}

/** Apply the adapter in `dir` to `model`'s linear layers. Errors name the file and tensor. */
export function loadAdapter(model: Gemma4Model, dir: string): LoadedAdapter {
  const cfgFile = join(dir, "adapter_config.json");
  const wFile = join(dir, "adapters.safetensors");
  if (!existsSync(cfgFile)) throw new WeightsError(`${cfgFile}: not found`);
  if (!existsSync(wFile)) throw new WeightsError(`${wFile}: not found`);
  const cfg = readJson(cfgFile) as Record<string, unknown>;
  const type = (cfg.fine_tune_type as string | undefined) ?? "lora";
  if (type !== "lora") throw new WeightsError(`${cfgFile}: fine_tune_type ${JSON.stringify(type)} is not supported (only "lora")`);
  const params = cfg.lora_parameters as Record<string, unknown> | undefined;
  const scale = params?.scale;
  const rank = params?.rank;
  if (typeof scale !== "number" || typeof rank !== "number") throw new WeightsError(`${cfgFile}: lora_parameters.scale and .rank must be numbers`);
  const loaded = loadSafetensors(wFile);
  const byModule = new Map<string, { a?: MlxArray; b?: MlxArray }>();
  try {
    for (const [name, a] of loaded.tensors) {
      const m = /^(.*)\.(lora_a|lora_b)$/.exec(name);
      if (!m) throw new WeightsError(`${wFile}: ${name} is not an adapter parameter (expected <module>.lora_a / .lora_b)`);
      const e = byModule.get(m[1]!) ?? {};
      e[m[2] === "lora_a" ? "a" : "b"] = a;
      byModule.set(m[1]!, e);
    }
    for (const [path, e] of byModule) {
      const mod = model.modules.get(path);
      if (!mod) throw new WeightsError(`${wFile}: ${path} is not a linear layer of this model`);
      if (!e.a || !e.b) throw new WeightsError(`${wFile}: ${path} needs both lora_a and lora_b`);
      const outDim = mod.weight.shape[0]!;
      const inDim = mod.quant ? (mod.weight.shape[1]! * 32) / mod.quant.bits : mod.weight.shape[1]!;
      if (e.a.shape.join() !== `${inDim},${rank}` || e.b.shape.join() !== `${rank},${outDim}`) {
        throw new WeightsError(`${wFile}: ${path}: lora_a ${e.a.describe()} / lora_b ${e.b.describe()} do not fit [${inDim}, ${rank}] / [${rank}, ${outDim}]`);
      }
    }
  } catch (e) {
    loaded[Symbol.dispose]();
    throw e;
  }
  for (const [path, e] of byModule) model.modules.get(path)!.lora = { a: e.a!, b: e.b!, scale };
  const dispose = (): void => {
    for (const path of byModule.keys()) delete model.modules.get(path)!.lora;
    loaded[Symbol.dispose]();
  };
  return { modules: [...byModule.keys()], scale, rank, dispose, [Symbol.dispose]: dispose };
}
