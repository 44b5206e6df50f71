// Images in a request (docs/images.md, "Runtime"): a GenerateRequest may carry preprocessed
// images (host pixels, @mlx-bun/models' preprocessImage) whose soft-token runs are already in its
// prompt ids (expandImageTokens). The scheduler prefills such a prompt alone and in one chunk:
// the vision tower encodes the images, multimodalInputs places the soft tokens (and mlx-vlm's
// bidirectional image mask where the model asks for it), and the forward pass fills the caches;
// decoding after the prompt is the plain text path, batched with other rows. Image prompts are
// never looked up in nor kept in the prompt cache (their KV depends on the pixels, which the
// token ids do not name).
import { evaluate, memory, MlxArray } from "@mlx-bun/mlx-ffi";
import type { Cache } from "@mlx-bun/kv-cache";
import { type ForwardInputs, type VisionEncoder, multimodalInputs, type PreprocessedImage } from "@mlx-bun/models";
import type { GenerationEngine } from "./engine-contract.ts";
import { RequestError } from "./request.ts";
import type { GenerateRequest } from "./types.ts";

/** One image of a request: its preprocessed pixels ([3, height, width] float32) and soft-token count. */
export type ImageInput = PreprocessedImage;

/** An engine that can take images: its vision tower and a forward pass with media inputs. */
export interface ImageEngine {
  vision(): VisionEncoder | null;
  forwardWith(ids: MlxArray, caches: Cache[], inputs: ForwardInputs): MlxArray;
}

export function hasImages(req: GenerateRequest): boolean {
  return Array.isArray(req.images) && req.images.length > 0;
}

function imageEngine(engine: GenerationEngine): ImageEngine | null {
  return engine.vision && engine.forwardWith ? (engine as GenerationEngine & ImageEngine) : null;
}

/**
 * Check a request's images against its prompt and the engine (RequestErrors naming the problem):
 * the engine has a vision tower; each image is well formed; the prompt holds one run of image
 * tokens per image, in order, of the image's soft-token count; the last prompt token is no image token.
 */
export function checkImages(req: GenerateRequest, engine: GenerationEngine): void {
  if (req.images === undefined) return;
  if (!Array.isArray(req.images)) throw new RequestError("images must be an array of preprocessed images");
  if (req.images.length === 0) return;
  const ie = imageEngine(engine);
  const vision = ie?.vision() ?? null;
  if (!vision) throw new RequestError(`the model ${engine.loaded.dir} has no vision tower: it cannot take images`);
  req.images.forEach((im, i) => {
    const ok =
      im !== null &&
      typeof im === "object" &&
      im.pixels instanceof Float32Array &&
      Number.isInteger(im.width) &&
      Number.isInteger(im.height) &&
      im.width > 0 &&
      im.height > 0 &&
      im.pixels.length === 3 * im.width * im.height &&
      Number.isInteger(im.softTokens) &&
      im.softTokens > 0;
    if (!ok) throw new RequestError(`images[${i}] is not a preprocessed image (pixels Float32Array [3, height, width], softTokens > 0)`);
  });
  const tok = vision.tokens.imageTokenId;
  const runs: number[] = [];
  const ids = req.promptIds;
  for (let i = 0; i < ids.length; i++) {
    if (ids[i] !== tok) continue;
    if (i === 0 || ids[i - 1] !== tok) runs.push(0);
    runs[runs.length - 1]!++;
  }
  if (runs.length !== req.images.length)
    throw new RequestError(
      `the prompt has ${runs.length} image token runs for ${req.images.length} images (expand each image placeholder with expandImageTokens)`,
    );
  runs.forEach((n, i) => {
    const want = req.images![i]!.softTokens;
    if (n !== want) throw new RequestError(`image ${i}: the prompt has ${n} image tokens, the image gives ${want} soft tokens`);
  });
  if (ids.at(-1) === tok) throw new RequestError("the prompt must not end with an image token");
}

/**
 * Prefill an image prompt: `ids` (all of the prompt but its last token) into `caches` (empty:
 * single-sequence caches, or a batch of one row), in one forward pass, the images' soft tokens in
 * place. The caches are evaluated and MLX's buffer cache cleared, as prefillChunk does.
 */
export function prefillImages(engine: GenerationEngine, caches: Cache[], ids: readonly number[], images: readonly ImageInput[]): void {
  const ie = imageEngine(engine);
  const vision = ie?.vision() ?? null;
  if (!ie || !vision) throw new RequestError(`the model ${engine.loaded.dir} has no vision tower: it cannot take images`);
  if (ids.length === 0) return;
  const offset = caches[0]?.offset ?? 0;
  if (offset !== 0) throw new RequestError(`an image prompt is prefilled from empty caches (offset ${offset})`);
  const feats: MlxArray[] = [];
  try {
    for (const im of images) feats.push(vision.encode(im));
    using mm = multimodalInputs(engine.loaded.model, vision.tokens, ids, feats, 0);
    {
      using x = MlxArray.fromNumbers([...ids], [1, ids.length], "int32");
      using logits = ie.forwardWith(x, caches, mm.inputs);
      void logits;
    }
    const states = caches.map((c) => c.state());
    try {
      evaluate(...states.flatMap((s) => s.tensors));
    } finally {
      for (const s of states) s[Symbol.dispose]();
    }
  } finally {
    for (const f of feats) f.dispose();
  }
  memory.clearCache();
}
