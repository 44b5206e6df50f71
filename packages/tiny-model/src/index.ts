// The tiny Gemma 4 checkpoint mlx-bun runs when no model is given. Its files are the ones the
// repository's set-up makes with tools/make-tiny-model (`--variant small --seed 0`: 6 layers,
// hidden size 64, vocabulary of 512, random bf16 weights, so its text is noise); the release copies
// them into model/ when the package is packed. In a checkout of the repository, before any packing,
// the directory is the set-up's own .native/models/tiny-gemma4.
import { existsSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const shipped = fileURLToPath(new URL("../model", import.meta.url));
const setup = fileURLToPath(new URL("../../../.native/models/tiny-gemma4", import.meta.url));

/** The checkpoint's directory (config.json, model.safetensors, tokenizer, chat template). */
export const tinyModelDir: string = existsSync(join(shipped, "config.json")) || !existsSync(join(setup, "config.json")) ? shipped : setup;

/** The name it is served and shown under. */
export const tinyModelId = "tiny-gemma4";

/** The files a copy of the checkpoint holds (the release checks each is packed). */
export const tinyModelFiles = [
  "config.json",
  "generation_config.json",
  "model.safetensors",
  "tokenizer.json",
  "tokenizer_config.json",
  "chat_template.jinja",
] as const;
