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
