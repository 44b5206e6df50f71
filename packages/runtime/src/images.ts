// Images in a request (docs/images.md, "Runtime"): a GenerateRequest may carry preprocessed
// images (host pixels, @mlx-bun/models' preprocessImage) whose soft-token runs are already in its
// prompt ids (expandImageTokens). The scheduler prefills such a prompt in a group of its own: the
// vision tower encodes the images, multimodalInputs places the soft tokens (and mlx-vlm's
// bidirectional image mask where the model asks for it), and the forward pass fills the caches;
// decoding after the prompt is the plain text path, batched with other rows. In the prompt cache
// an image prompt is keyed by its key ids (imageCacheKeys): every position of an image's run is
// an id derived from the SHA-256 of its pixels, so KV is never reused across different images.
import { createHash } from "node:crypto";
import { evaluate, memory, MlxArray } from "@mlx-bun/mlx-ffi";
import type { Cache } from "@mlx-bun/kv-cache";
import { bidirectionalVision, type ForwardInputs, type VisionEncoder, multimodalInputs, type PreprocessedImage } from "@mlx-bun/models";
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

/** Each image's run in `ids`: the positions [start, end) of its image tokens, in order. */
export function imageRuns(ids: readonly number[], imageTokenId: number): { start: number; end: number }[] {
  const runs: { start: number; end: number }[] = [];
  for (let i = 0; i < ids.length; i++) {
    if (ids[i] !== imageTokenId) continue;
    if (i === 0 || ids[i - 1] !== imageTokenId) runs.push({ start: i, end: i });
    runs[runs.length - 1]!.end = i + 1;
  }
  return runs;
}

/** Key words per image: 48-bit pieces of the SHA-256 of its content. */
const imageWords = new WeakMap<ImageInput, number[]>();

/** An image's content key: five 48-bit words of the SHA-256 of its size, soft-token count and pixels. */
function contentWords(im: ImageInput): number[] {
  let w = imageWords.get(im);
  if (w) return w;
  const h = createHash("sha256");
  h.update(Uint32Array.of(im.width, im.height, im.softTokens));
  h.update(new Uint8Array(im.pixels.buffer, im.pixels.byteOffset, im.pixels.byteLength));
  const d = h.digest();
  w = Array.from({ length: 5 }, (_, k) => d.readUIntBE(6 * k, 6));
  imageWords.set(im, w);
  return w;
}

/** How an image prompt is keyed in the prompt cache, and where a reused prefix may end. */
export interface ImageCacheKeys {
  /**
   * The prompt ids with each image token replaced by a negative id from its image's content hash
   * (position j of a run: -(1 + word[j mod 5]), five 48-bit words of the SHA-256 of the image's
   * size, soft-token count and pixels): two prompts share a key prefix through an image only when
   * they hold the same image at the same place. Never a token id: used for lookup/insert only.
   */
  keys: number[];
  /** End of the last image's run (0 without images). */
  lastRunEnd: number;
  /** The longest allowed reuse of at most `r` prompt tokens (PromptCache LookupOptions.cut). */
  cut: (r: number) => number;
}

/**
 * The prompt-cache keys of an image request (checked by checkImages). A reused prefix never ends
 * inside an image's run (the run's soft tokens, and its bidirectional block, go in one prefill):
 * such a cut moves back to the run's start. On a model with bidirectional image attention the
 * block mask is built only for a prefill from empty caches (as mlx-vlm's), so there a reused
 * prefix must hold every image: a cut before the last image's end is no reuse at all.
 */
export function imageCacheKeys(req: GenerateRequest, engine: GenerationEngine): ImageCacheKeys {
  const vision = imageEngine(engine)?.vision() ?? null;
  if (!vision || !req.images?.length) return { keys: [...req.promptIds], lastRunEnd: 0, cut: (r) => r };
  const runs = imageRuns(req.promptIds, vision.tokens.imageTokenId);
  const keys = [...req.promptIds];
  runs.forEach((run, i) => {
    const w = contentWords(req.images![i]!);
    for (let p = run.start; p < run.end; p++) keys[p] = -(1 + w[(p - run.start) % w.length]!);
  });
  const lastRunEnd = runs.at(-1)?.end ?? 0;
  const bidirectional = bidirectionalVision(engine.loaded.model);
  const cut = (r: number): number => {
    if (bidirectional) return r >= lastRunEnd ? r : 0;
    const inside = runs.find((run) => r > run.start && r < run.end);
    return inside ? inside.start : r;
  };
  return { keys, lastRunEnd, cut };
}

/** The images of `req` whose runs lie in `req.promptIds.slice(from, to)` (runs are never split: checked). */
export function imagesIn(engine: GenerationEngine, req: GenerateRequest, from: number, to: number): ImageInput[] {
  const vision = imageEngine(engine)?.vision() ?? null;
  if (!vision || !req.images?.length) return [];
  const runs = imageRuns(req.promptIds, vision.tokens.imageTokenId);
  const out: ImageInput[] = [];
  runs.forEach((run, i) => {
    if (run.end <= from || run.start >= to) return;
    if (run.start < from || run.end > to) throw new RequestError(`image ${i}'s run [${run.start}, ${run.end}) is split by a prefill chunk [${from}, ${to})`);
    out.push(req.images![i]!);
  });
  return out;
}

/**
 * Prefill a chunk of an image prompt: `ids` (whole image runs, never a part of one) into `caches`
 * (single-sequence caches, or a batch of one row), at their offset, in one forward pass, the soft
 * tokens of `images` (the images whose runs are in `ids`, in order) in place. On a model with
 * bidirectional image attention a chunk holding images starts from empty caches. The caches are
 * evaluated and MLX's buffer cache cleared, as prefillChunk does.
 */
export function prefillImages(engine: GenerationEngine, caches: Cache[], ids: readonly number[], images: readonly ImageInput[]): void {
  const ie = imageEngine(engine);
  const vision = ie?.vision() ?? null;
  if (!ie || !vision) throw new RequestError(`the model ${engine.loaded.dir} has no vision tower: it cannot take images`);
  if (ids.length === 0) return;
  const offset = caches[0]?.offset ?? 0;
  if (offset !== 0 && images.length && bidirectionalVision(engine.loaded.model))
    throw new RequestError(`images on a model with bidirectional image attention are prefilled from empty caches (offset ${offset})`);
  const feats: MlxArray[] = [];
  try {
    for (const im of images) feats.push(vision.encode(im));
    using mm = multimodalInputs(engine.loaded.model, vision.tokens, ids, feats, offset);
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
