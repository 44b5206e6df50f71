/**
 * @mlx-bun/models: Gemma 4 for MLX on Bun: config.json parsing, weight files and mlx-lm's
 * sanitize, the expected-tensor manifest, the tokenizer (with a streaming detokenizer) and the
 * chat template.
 */
export * from "./config.ts";
export * from "./errors.ts";
export * from "./weights.ts";
export * from "./tokenizer.ts";
export * from "./chat-template.ts";
export { Gemma4Model } from "./model/gemma4.ts";
export { type KvMode, codecFor, kvModeName, parseKvMode } from "./model/kv-mode.ts";
export { embed, embedAsLinear, linear, moduleWeights, switchLinear, type ModuleWeights } from "./model/nn.ts";
export { type LoadedModel, loadModel, loadTextSide } from "./load.ts";
export { type LoadedAdapter, loadAdapter } from "./lora.ts";
export { shardModel, TensorParallel } from "./model/shard.ts";
