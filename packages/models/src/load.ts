// Open a checkpoint directory: config, lazily loaded weights, the model, tokenizer and chat template.
import { createHash } from "node:crypto";
import { ChatTemplate } from "./chat-template.ts";
import { type Gemma4Config, loadGemma4Config } from "./config.ts";
import { Gemma4Model } from "./model/gemma4.ts";
import { Gemma4Tokenizer } from "./tokenizer.ts";
import { loadWeights, type LoadedWeights } from "./weights.ts";

/** Everything generation needs from one checkpoint. Dispose it to free the weights. */
export interface LoadedModel extends Disposable {
  dir: string;
  config: Gemma4Config;
  model: Gemma4Model;
  tokenizer: Gemma4Tokenizer;
  /** null when the checkpoint has no chat template. */
  template: ChatTemplate | null;
  /** Identifies the weights and architecture (config + tensor names, shapes, dtypes): a KV snapshot of another model is refused. */
  fingerprint: string;
  weights: LoadedWeights;
  dispose(): void;
}

/** Load a checkpoint from a local directory (weights stay lazy until first use). */
export function loadModel(dir: string): LoadedModel {
  const config = loadGemma4Config(dir);
  const tokenizer = Gemma4Tokenizer.load(dir);
  let template: ChatTemplate | null = null;
  try {
    template = ChatTemplate.load(dir, tokenizer);
  } catch {
    template = null;
  }
  const weights = loadWeights(dir, config);
  let model: Gemma4Model;
  try {
    model = new Gemma4Model(config, weights.tensors);
  } catch (e) {
    weights.dispose();
    throw e;
  }
  const h = createHash("sha256").update(JSON.stringify(config.raw));
  for (const [name, a] of [...weights.tensors].sort(([a], [b]) => (a < b ? -1 : 1))) h.update(`${name}:${a.dtype}:${a.shape.join("x")};`);
  const fingerprint = h.digest("hex").slice(0, 32);
  const dispose = (): void => {
    model.dispose();
    weights.dispose();
  };
  return { dir, config, model, tokenizer, template, fingerprint, weights, dispose, [Symbol.dispose]: dispose };
}
