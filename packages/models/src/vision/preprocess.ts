// Gemma 4 image preprocessing, as mlx-vlm 0.7.10's processing_gemma4.Gemma4ImageProcessor does it
// (docs/images.md): decode (sharp: EXIF orientation applied, alpha dropped, grey replicated, ICC
// profile ignored — mlx_vlm.utils.load_image's exif_transpose + convert("RGB")), an
// aspect-ratio-preserving resize to a patch budget with Pillow's BICUBIC filter (ported here bit
// for bit: Pillow's separable fixed-point resampler, horizontal pass then vertical), rescale by
// 1/255 in float32, optional normalize, channels first.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import type Sharp from "sharp";

// Loaded on first use: a text-only process never loads libvips (and runs where it is not installed).
let sharpLoad: Promise<typeof Sharp> | undefined;
const loadSharp = (): Promise<typeof Sharp> => (sharpLoad ??= import("sharp").then((m) => m.default));

/** Why an image was refused; `code` lets a server map it to a 400 with the reason. */
export type ImageErrorCode = "not_an_image" | "unsupported_format" | "truncated" | "too_large" | "too_small" | "invalid";

export class ImageError extends Error {
  override name = "ImageError";
  constructor(
    readonly code: ImageErrorCode,
    message: string,
  ) {
    super(message);
  }
}

/** The image processor's settings (processor_config.json "image_processor", or a flat preprocessor_config.json). */
export interface ImageProcessorConfig {
  patchSize: number;
  maxSoftTokens: number;
  poolingKernelSize: number;
  doResize: boolean;
  doRescale: boolean;
  rescaleFactor: number;
  doNormalize: boolean;
  imageMean: [number, number, number];
  imageStd: [number, number, number];
}

/** Gemma4ImageProcessor's defaults (processing_gemma4.py __init__). */
export const DEFAULT_IMAGE_PROCESSOR: ImageProcessorConfig = {
  patchSize: 16,
  maxSoftTokens: 280,
  poolingKernelSize: 3,
  doResize: true,
  doRescale: true,
  rescaleFactor: 1 / 255,
  doNormalize: false,
  imageMean: [0.5, 0.5, 0.5],
  imageStd: [0.5, 0.5, 0.5],
};

const FLAT_KEYS = ["patch_size", "max_soft_tokens", "pooling_kernel_size"];

/**
 * The image processor config of a checkpoint directory, read as Gemma4Processor.from_pretrained
 * reads it: processor_config.json, else preprocessor_config.json; its "image_processor" block, or
 * the flat keys; defaults for what is missing.
 */
export function loadImageProcessorConfig(dir: string): ImageProcessorConfig {
  let raw: Record<string, unknown> = {};
  for (const f of ["processor_config.json", "preprocessor_config.json"]) {
    const p = join(dir, f);
    if (!existsSync(p)) continue;
    const j: unknown = JSON.parse(readFileSync(p, "utf8"));
    if (typeof j === "object" && j !== null) raw = j as Record<string, unknown>;
    break;
  }
  let ip: Record<string, unknown> = {};
  const block = raw.image_processor;
  if (typeof block === "object" && block !== null) ip = block as Record<string, unknown>;
  else if (!("image_processor_type" in raw) && FLAT_KEYS.some((k) => k in raw)) ip = raw;
  const D = DEFAULT_IMAGE_PROCESSOR;
  const int = (k: string, d: number): number => {
    const v = ip[k];
    if (v === undefined || v === null) return d;
    if (typeof v !== "number" || !Number.isInteger(v) || v <= 0)
      throw new ImageError("invalid", `${dir}: image processor ${k} must be a positive integer, got ${JSON.stringify(v)}`);
    return v;
  };
  const bool = (k: string, d: boolean): boolean => (typeof ip[k] === "boolean" ? (ip[k] as boolean) : d);
  const triple = (k: string, d: [number, number, number]): [number, number, number] => {
    const v = ip[k];
    if (Array.isArray(v) && v.length === 3 && v.every((x) => typeof x === "number")) return v as [number, number, number];
    if (Array.isArray(v) && v.length === 0) return d; // `image_mean or [...]`
    return d;
  };
  return {
    patchSize: int("patch_size", D.patchSize),
    // Gemma4UnifiedImageProcessor takes num_soft_tokens where max_soft_tokens is absent.
    maxSoftTokens: ip.max_soft_tokens == null ? int("num_soft_tokens", D.maxSoftTokens) : int("max_soft_tokens", D.maxSoftTokens),
    poolingKernelSize: int("pooling_kernel_size", D.poolingKernelSize),
    doResize: bool("do_resize", D.doResize),
    doRescale: bool("do_rescale", D.doRescale),
    rescaleFactor: typeof ip.rescale_factor === "number" ? ip.rescale_factor : D.rescaleFactor,
    doNormalize: bool("do_normalize", D.doNormalize),
    imageMean: triple("image_mean", D.imageMean),
    imageStd: triple("image_std", D.imageStd),
  };
}

/** 8-bit RGB pixels, row-major, 3 bytes per pixel. */
export interface RgbImage {
  width: number;
  height: number;
  data: Uint8Array;
}

/** Refused at or above this many pixels (width x height) before decoding. */
export const DEFAULT_MAX_PIXELS = 100_000_000;

export interface DecodeOptions {
  /** Images of this many pixels or more are refused (default 100 megapixels). */
  maxPixels?: number;
}

/**
 * Decode an encoded image (PNG, JPEG, WebP, GIF first frame, TIFF, AVIF...) to 8-bit RGB, as
 * mlx-vlm's load_image: EXIF orientation applied, alpha dropped (not composited), grey replicated.
 * A truncated or corrupt file, a file that is no image, and one of `maxPixels` or more are
 * ImageErrors naming the problem.
 */
export async function decodeImage(bytes: Uint8Array, opts: DecodeOptions = {}): Promise<RgbImage> {
  const maxPixels = opts.maxPixels ?? DEFAULT_MAX_PIXELS;
  if (bytes.length === 0) throw new ImageError("not_an_image", "the image is empty (0 bytes)");
  const sharp = await loadSharp();
  let meta: Sharp.Metadata;
  try {
    meta = await sharp(bytes, { limitInputPixels: false }).metadata();
  } catch (e) {
    throw new ImageError("not_an_image", `the data is not an image of a supported format (${firstLine(e)})`);
  }
  const w = meta.autoOrient?.width ?? meta.width ?? 0;
  const h = meta.autoOrient?.height ?? meta.height ?? 0;
  if (!(w > 0 && h > 0)) throw new ImageError("not_an_image", `the ${meta.format ?? "image"} has no size`);
  if (w * h >= maxPixels) {
    throw new ImageError(
      "too_large",
      `the image is ${w}x${h} = ${((w * h) / 1e6).toFixed(1)} megapixels; the limit is under ${(maxPixels / 1e6).toFixed(0)} megapixels`,
    );
  }
  try {
    const { data, info } = await sharp(bytes, { limitInputPixels: false, failOn: "truncated", ignoreIcc: true, pages: 1 })
      .rotate()
      .removeAlpha()
      .toColourspace("srgb")
      .raw({ depth: "uchar" })
      .toBuffer({ resolveWithObject: true });
    if (info.channels !== 3) throw new ImageError("invalid", `decoding gave ${info.channels} channels, expected 3 (RGB)`);
    return { width: info.width, height: info.height, data: new Uint8Array(data.buffer, data.byteOffset, data.byteLength) };
  } catch (e) {
    if (e instanceof ImageError) throw e;
    const msg = firstLine(e);
    if (/truncat|premature|end of|short|incomplete|unexpected end|read error|corrupt|damaged/i.test(msg)) {
      throw new ImageError("truncated", `the ${meta.format ?? "image"} is truncated or corrupt (${msg})`);
    }
    throw new ImageError("invalid", `the ${meta.format ?? "image"} could not be decoded (${msg})`);
  }
}

function firstLine(e: unknown): string {
  return String((e as Error)?.message ?? e)
    .split("\n")[0]!
    .trim();
}

/**
 * processing_gemma4.get_aspect_ratio_preserving_size: the largest size with at most
 * `maxPatches` patches whose sides are multiples of pooling x patch.
 */
export function aspectRatioPreservingSize(
  height: number,
  width: number,
  patchSize: number,
  maxPatches: number,
  pooling: number,
): { height: number; width: number } {
  const targetPx = maxPatches * patchSize ** 2;
  const factor = Math.sqrt(targetPx / (height * width));
  const sideMult = pooling * patchSize;
  let th = Math.floor((factor * height) / sideMult) * sideMult;
  let tw = Math.floor((factor * width) / sideMult) * sideMult;
  if (th === 0 && tw === 0) throw new ImageError("too_small", `a ${width}x${height} image would be resized to 0 x 0`);
  const maxSide = Math.floor(maxPatches / pooling ** 2) * sideMult;
  if (th === 0) {
    th = sideMult;
    tw = Math.min(Math.floor(width / height) * sideMult, maxSide);
  } else if (tw === 0) {
    tw = sideMult;
    th = Math.min(Math.floor(height / width) * sideMult, maxSide);
  }
  return { height: th, width: tw };
}

// ---------------------------------------------------------------------------------------------
// Pillow's BICUBIC resize (libImaging/Resample.c), 8 bits per channel
// ---------------------------------------------------------------------------------------------

const PRECISION_BITS = 32 - 8 - 2;
const ONE = 1 << PRECISION_BITS;

function bicubic(x: number): number {
  const a = -0.5;
  if (x < 0) x = -x;
  if (x < 1) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2) return (((x - 5) * x + 8) * x - 4) * a;
  return 0;
}

/** precompute_coeffs + normalize_coeffs_8bpc: per output index its first input, tap count and fixed-point weights. */
function coeffs(inSize: number, outSize: number): { ksize: number; bounds: Int32Array; kk: Int32Array } {
  const support0 = 2.0;
  const scale = inSize / outSize;
  const filterscale = scale < 1 ? 1 : scale;
  const support = support0 * filterscale;
  const ksize = Math.ceil(support) * 2 + 1;
  const bounds = new Int32Array(outSize * 2);
  const kk = new Int32Array(outSize * ksize);
  const k = new Float64Array(ksize);
  for (let xx = 0; xx < outSize; xx++) {
    const center = (xx + 0.5) * scale;
    let ww = 0;
    const ss = 1.0 / filterscale;
    let xmin = Math.trunc(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    let xmax = Math.trunc(center + support + 0.5);
    if (xmax > inSize) xmax = inSize;
    xmax -= xmin;
    k.fill(0);
    for (let x = 0; x < xmax; x++) {
      const w = bicubic((x + xmin - center + 0.5) * ss);
      k[x] = w;
      ww += w;
    }
    for (let x = 0; x < xmax; x++) if (ww !== 0) k[x]! /= ww;
    for (let x = 0; x < ksize; x++) {
      const v = k[x]!;
      kk[xx * ksize + x] = v < 0 ? Math.trunc(-0.5 + v * ONE) : Math.trunc(0.5 + v * ONE);
    }
    bounds[xx * 2] = xmin;
    bounds[xx * 2 + 1] = xmax;
  }
  return { ksize, bounds, kk };
}

function clip8(ss: number): number {
  const v = Math.floor(ss / ONE); // `in >> PRECISION_BITS` (arithmetic shift)
  return v < 0 ? 0 : v > 255 ? 255 : v;
}

/** Image.resize((width, height), Image.BICUBIC) on an RGB image, bit for bit as Pillow 12. */
export function resizeBicubic(img: RgbImage, width: number, height: number): RgbImage {
  if (img.width === width && img.height === height) return { width, height, data: img.data.slice() };
  const needH = width !== img.width;
  const needV = height !== img.height;
  const horiz = coeffs(img.width, width);
  const vert = coeffs(img.height, height);
  let src = img;
  if (needH) {
    // Only the rows the vertical pass reads (ybox_first..ybox_last); rows are independent.
    const yFirst = needV ? vert.bounds[0]! : 0;
    const yLast = needV ? vert.bounds[height * 2 - 2]! + vert.bounds[height * 2 - 1]! : img.height;
    const rows = yLast - yFirst;
    const out = new Uint8Array(width * rows * 3);
    const { ksize, bounds, kk } = horiz;
    const inW = img.width;
    const data = img.data;
    for (let y = 0; y < rows; y++) {
      const rowIn = (y + yFirst) * inW * 3;
      const rowOut = y * width * 3;
      for (let xx = 0; xx < width; xx++) {
        const xmin = bounds[xx * 2]!;
        const xmax = bounds[xx * 2 + 1]!;
        const kb = xx * ksize;
        let s0 = ONE >> 1;
        let s1 = ONE >> 1;
        let s2 = ONE >> 1;
        for (let x = 0; x < xmax; x++) {
          const w = kk[kb + x]!;
          const p = rowIn + (x + xmin) * 3;
          s0 += data[p]! * w;
          s1 += data[p + 1]! * w;
          s2 += data[p + 2]! * w;
        }
        const o = rowOut + xx * 3;
        out[o] = clip8(s0);
        out[o + 1] = clip8(s1);
        out[o + 2] = clip8(s2);
      }
    }
    src = { width, height: rows, data: out };
    if (needV) for (let i = 0; i < height; i++) vert.bounds[i * 2]! -= yFirst;
  }
  if (!needV) return src;
  const { ksize, bounds, kk } = vert;
  const out = new Uint8Array(width * height * 3);
  const data = src.data;
  const rowLen = width * 3;
  for (let yy = 0; yy < height; yy++) {
    const ymin = bounds[yy * 2]!;
    const ymax = bounds[yy * 2 + 1]!;
    const kb = yy * ksize;
    const rowOut = yy * rowLen;
    for (let i = 0; i < rowLen; i++) {
      let s = ONE >> 1;
      for (let y = 0; y < ymax; y++) s += data[(y + ymin) * rowLen + i]! * kk[kb + y]!;
      out[rowOut + i] = clip8(s);
    }
  }
  return { width, height, data: out };
}

// ---------------------------------------------------------------------------------------------
// The processor
// ---------------------------------------------------------------------------------------------

/** One preprocessed image: pixel values [3, height, width] float32 (channels first) and its soft-token count. */
export interface PreprocessedImage {
  pixels: Float32Array;
  height: number;
  width: number;
  softTokens: number;
}

/** Gemma4ImageProcessor.preprocess on one decoded image. */
export function preprocessImage(img: RgbImage, cfg: ImageProcessorConfig): PreprocessedImage {
  let im = img;
  if (cfg.doResize) {
    const maxPatches = cfg.maxSoftTokens * cfg.poolingKernelSize ** 2;
    const t = aspectRatioPreservingSize(img.height, img.width, cfg.patchSize, maxPatches, cfg.poolingKernelSize);
    if (t.height !== img.height || t.width !== img.width) im = resizeBicubic(img, t.width, t.height);
  }
  const { width, height, data } = im;
  const n = width * height;
  const pixels = new Float32Array(3 * n);
  const f = Math.fround;
  const scale = f(cfg.rescaleFactor);
  const mean = cfg.imageMean.map(f);
  const std = cfg.imageStd.map(f);
  for (let i = 0; i < n; i++) {
    for (let c = 0; c < 3; c++) {
      let v = data[i * 3 + c]!;
      if (cfg.doRescale) v = f(v * scale);
      if (cfg.doNormalize) v = f(f(v - mean[c]!) / std[c]!);
      pixels[c * n + i] = v;
    }
  }
  const patches = Math.floor(height / cfg.patchSize) * Math.floor(width / cfg.patchSize);
  return { pixels, height, width, softTokens: Math.floor(patches / cfg.poolingKernelSize ** 2) };
}
