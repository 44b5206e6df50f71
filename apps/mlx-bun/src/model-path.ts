// --model: a local checkpoint directory, a Hugging Face repo id (downloaded into the cache), or
// nothing (the bundled tiny model: @mlx-bun/tiny-model, which in the repository is the one
// tools/setup.sh makes).
import { existsSync, statSync } from "node:fs";
import { join, resolve } from "node:path";
import { tinyModelDir as bundledTinyModelDir } from "@mlx-bun/tiny-model";
import { type DownloadOptions, downloadModel, isRepoId } from "./hub.ts";

/** The bundled tiny model ($MLX_BUN_TINY_MODEL_DIR overrides it). */
export const TINY_MODEL_DIR = bundledTinyModelDir;

function tinyModelDir(): string {
  return process.env.MLX_BUN_TINY_MODEL_DIR || TINY_MODEL_DIR;
}

export class ModelNotFoundError extends Error {
  override name = "ModelNotFoundError";
}

export interface ResolvedModel {
  /** A local directory holding config.json. */
  dir: string;
  /** The name to show and serve: the repo id, the path as given, or "tiny-gemma4". */
  id: string;
  source: "local" | "hub" | "bundled";
}

/** Resolve --model to a local directory, downloading a repo id if needed. */
export async function resolveModel(model: string | undefined, dl: DownloadOptions = {}): Promise<ResolvedModel> {
  if (model === undefined || model === "") {
    const tiny = tinyModelDir();
    if (!existsSync(join(tiny, "config.json"))) {
      throw new ModelNotFoundError(
        `no --model given and the bundled tiny model is missing (${tiny}).\n` +
          "  In the repository, run `bash tools/setup.sh` to create it; an installed mlx-bun ships it in @mlx-bun/tiny-model.\n" +
          "  Or pass --model <dir | owner/repo>.",
      );
    }
    return { dir: tiny, id: "tiny-gemma4", source: "bundled" };
  }
  const local = resolve(model);
  if (existsSync(local)) {
    if (!statSync(local).isDirectory()) throw new ModelNotFoundError(`--model ${model}: not a directory`);
    if (!existsSync(join(local, "config.json"))) throw new ModelNotFoundError(`--model ${model}: no config.json in ${local}`);
    return { dir: local, id: model, source: "local" };
  }
  if (isRepoId(model)) return { dir: await downloadModel(model, dl), id: model, source: "hub" };
  throw new ModelNotFoundError(`--model ${model}: no such directory, and not a Hugging Face repo id (owner/name)`);
}
