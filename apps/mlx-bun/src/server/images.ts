// OpenAI image_url content parts of /v1/chat/completions (docs/server.md, "Images"): each part
// becomes the chat template's image item ({"type": "image"}, which Gemma 4's template renders as
// its image placeholder); the image itself is read (a data: URL, a local path or file:// URL, or
// http(s) with --allow-remote-images), decoded and preprocessed as mlx-vlm does
// (@mlx-bun/models' decodeImage + preprocessImage), and the placeholder is expanded to the image's
// soft tokens (expandImageTokens). The runtime prefills the prompt with the images (GenerateRequest.images).
import { readFile } from "node:fs/promises";
import { isAbsolute } from "node:path";
import { fileURLToPath } from "node:url";
import {
  DEFAULT_MAX_PIXELS,
  decodeImage,
  expandImageTokens,
  type Gemma4Config,
  type ImageProcessorConfig,
  loadImageProcessorConfig,
  type MultimodalTokens,
  parseMultimodalTokens,
  takesImages,
  type PreprocessedImage,
  preprocessImage,
} from "@mlx-bun/models";
import type { ChatMessage } from "@mlx-bun/models";
import { ApiError, badField } from "./errors.ts";

/** What the server needs to take images: the model's processor settings and image token ids. */
export interface ImageSupport {
  processor: ImageProcessorConfig;
  tokens: MultimodalTokens;
  /** Fetch http(s) image URLs (--allow-remote-images); otherwise they are refused with a 400. */
  allowRemote: boolean;
  /** Images of this many pixels or more are refused (default 100 megapixels). */
  maxPixels?: number;
  /** Largest image file in bytes (default 64 MiB). */
  maxBytes?: number;
}

/** The image support of a loaded checkpoint, or null when it has no vision tower. */
export function imageSupportFor(loaded: { dir: string; config: Gemma4Config }, o: { allowRemote?: boolean } = {}): ImageSupport | null {
  if (!takesImages(loaded.config)) return null;
  return { processor: loadImageProcessorConfig(loaded.dir), tokens: parseMultimodalTokens(loaded.config), allowRemote: o.allowRemote ?? false };
}

/** The chat-template item of an image part; `url` is what the server reads (not passed to the template). */
export interface ImageItem {
  type: "image";
  url: string;
  param: string;
}

/** Check an OpenAI image_url content part (`{type: "image_url", image_url: {url, detail?}}`) at `param`. */
export function imagePart(param: string, part: Record<string, unknown>): ImageItem {
  const iu = part.image_url;
  const url = typeof iu === "string" ? iu : typeof iu === "object" && iu !== null ? (iu as Record<string, unknown>).url : undefined;
  if (typeof url !== "string" || url.length === 0)
    throw badField(`${param}.image_url`, `${param}.image_url must be an object with a non-empty "url" string`, "invalid_type");
  const detail = typeof iu === "object" && iu !== null ? (iu as Record<string, unknown>).detail : undefined;
  if (detail !== undefined && detail !== null && !["auto", "low", "high"].includes(detail as string))
    throw badField(`${param}.image_url.detail`, `${param}.image_url.detail must be "auto", "low" or "high", got ${JSON.stringify(detail)}`);
  return { type: "image", url, param: `${param}.image_url` };
}

function isImageItem(x: unknown): x is ImageItem {
  return typeof x === "object" && x !== null && (x as ImageItem).type === "image" && typeof (x as ImageItem).url === "string";
}

/** The image items of the messages, in prompt order. */
export function imageItems(messages: readonly ChatMessage[]): ImageItem[] {
  return imageItemsWithRole(messages).map((x) => x.item);
}

function imageItemsWithRole(messages: readonly ChatMessage[]): { item: ImageItem; role: string }[] {
  const out: { item: ImageItem; role: string }[] = [];
  for (const m of messages) if (Array.isArray(m.content)) for (const p of m.content) if (isImageItem(p)) out.push({ item: p, role: m.role });
  return out;
}

/**
 * The chat content part another endpoint's image block becomes (Anthropic image blocks, Responses
 * input_image parts): an image_url part, checked and read as /v1/chat/completions' own. Its error
 * path is the endpoint's: give the same `param`s, in prompt order, to `nameImageItems` once the
 * translated request is parsed.
 */
export function imageUrlPart(url: string): { type: "image_url"; image_url: { url: string } } {
  return { type: "image_url", image_url: { url } };
}

/** Name the parsed request's image items (in prompt order) with the paths of the endpoint's own blocks. */
export function nameImageItems(messages: readonly ChatMessage[], params: readonly string[]): void {
  const items = imageItems(messages);
  if (items.length !== params.length) throw new Error(`internal: ${items.length} image items but ${params.length} image block paths`);
  items.forEach((it, i) => {
    it.param = params[i]!;
  });
}

/** Read, decode and preprocess every image of the messages (400s naming the part on bad input). */
export async function loadRequestImages(
  messages: readonly ChatMessage[],
  support: ImageSupport | null | undefined,
  modelId: string,
): Promise<PreprocessedImage[]> {
  const items = imageItems(messages);
  if (!items.length) return [];
  if (!support) throw badField(items[0]!.param, `the model '${modelId}' has no vision tower: it does not take images`, "model_not_multimodal");
  const out: PreprocessedImage[] = [];
  for (const it of items) {
    const bytes = await readImage(it, support);
    try {
      const img = await decodeImage(bytes, { maxPixels: support.maxPixels ?? DEFAULT_MAX_PIXELS });
      out.push(preprocessImage(img, support.processor));
    } catch (e) {
      const err = e as Error & { code?: string };
      if (err.name === "ImageError") throw badField(it.param, `${it.param}: ${err.message}`, `image_${err.code ?? "invalid"}`);
      throw e;
    }
  }
  return out;
}

async function readImage(it: ImageItem, s: ImageSupport): Promise<Uint8Array> {
  const maxBytes = s.maxBytes ?? 64 * 1024 * 1024;
  const url = it.url;
  const bad = (msg: string, code = "invalid_image_url") => badField(it.param, `${it.param}: ${msg}`, code);
  if (/^data:/i.test(url)) {
    const comma = url.indexOf(",");
    if (comma < 0) throw bad("a data: URL needs a comma before its data");
    const meta = url.slice(5, comma).split(";");
    const type = (meta[0] ?? "").trim().toLowerCase();
    if (!type.startsWith("image/"))
      throw bad(`the data: URL's content type must be image/*, got ${JSON.stringify(type || "text/plain")}`, "invalid_image_content_type");
    const data = url.slice(comma + 1);
    if (meta.slice(1).some((x) => x.trim().toLowerCase() === "base64")) {
      if (!/^[A-Za-z0-9+/_\-\s]*={0,2}\s*$/.test(data)) throw bad("the data: URL's base64 data is not valid base64");
      const buf = Buffer.from(data, "base64");
      if (buf.length > maxBytes) throw bad(`the image is ${buf.length} bytes, more than the limit of ${maxBytes}`, "image_too_large");
      return new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength);
    }
    try {
      return new TextEncoder().encode(decodeURIComponent(data));
    } catch {
      throw bad("the data: URL's data is not valid percent-encoding");
    }
  }
  if (/^https?:/i.test(url)) {
    if (!s.allowRemote)
      throw bad("http(s) image URLs are not fetched unless the server runs with --allow-remote-images; send a data: URL", "remote_images_disabled");
    let r: Response;
    try {
      r = await fetch(url, { redirect: "follow", signal: AbortSignal.timeout(30_000) });
    } catch (e) {
      throw bad(`fetching the image failed (${(e as Error).message})`, "image_fetch_failed");
    }
    if (!r.ok) throw bad(`fetching the image gave HTTP ${r.status}`, "image_fetch_failed");
    const buf = new Uint8Array(await r.arrayBuffer());
    if (buf.length > maxBytes) throw bad(`the image is ${buf.length} bytes, more than the limit of ${maxBytes}`, "image_too_large");
    return buf;
  }
  let path: string;
  if (/^file:/i.test(url)) {
    try {
      path = fileURLToPath(url);
    } catch (e) {
      throw bad(`not a valid file: URL (${(e as Error).message})`);
    }
  } else if (isAbsolute(url)) path = url;
  else if (/^[a-z][a-z0-9+.-]*:/i.test(url))
    throw bad(`unsupported URL scheme ${JSON.stringify(url.split(":")[0])}: use data:, file:, an absolute path or http(s)`);
  else throw bad("a local image path must be absolute (or a file:// URL)");
  try {
    const buf = await readFile(path);
    if (buf.length > maxBytes) throw bad(`the image is ${buf.length} bytes, more than the limit of ${maxBytes}`, "image_too_large");
    return new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength);
  } catch (e) {
    if (e instanceof ApiError) throw e;
    throw bad(`cannot read ${path} (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`, "image_not_found");
  }
}

/**
 * The prompt ids with each image placeholder expanded to its image's soft tokens. A 400 when they
 * do not match: the chat template did not render an image item, e.g. one in a tool message (tool
 * results) — named by its part's path.
 */
export function expandPromptImages(
  ids: number[],
  images: readonly PreprocessedImage[],
  tokens: MultimodalTokens,
  messages: readonly ChatMessage[] = [],
): number[] {
  try {
    return expandImageTokens(
      ids,
      images.map((i) => i.softTokens),
      tokens,
    );
  } catch (e) {
    const placed = ids.filter((id) => id === tokens.imageTokenId).length;
    const items = imageItemsWithRole(messages);
    const tool = placed < images.length ? items.find((x) => x.role === "tool") : undefined;
    const param = tool?.item.param ?? items[Math.min(placed, items.length - 1)]?.item.param ?? "messages";
    const why = tool
      ? "the model's chat template does not render images in tool messages (tool results); send the image in a user message"
      : `${(e as Error).message} (the chat template wrote ${placed} image placeholders for ${images.length} images)`;
    throw new ApiError(400, `${param}: ${why}`, param, "invalid_value");
  }
}
