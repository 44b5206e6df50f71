// Image preprocessing against mlx-vlm 0.7.10's Gemma4ImageProcessor (tools/oracle/gemma4_vision_oracle.py
// pixels): the same files opened by mlx_vlm.utils.load_image and by decodeImage (sharp), resized,
// rescaled; pixel values compared element by element.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadSafetensors } from "@mlx-bun/mlx-ffi";
import sharp from "sharp";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runPython } from "../../../tools/oracle/oracle.ts";
import {
  aspectRatioPreservingSize,
  DEFAULT_IMAGE_PROCESSOR,
  decodeImage,
  ImageError,
  type ImageProcessorConfig,
  loadImageProcessorConfig,
  preprocessImage,
} from "../src/vision/preprocess.ts";
import { ROOT } from "./helpers.ts";

const ORACLE = join(ROOT, "tools", "oracle", "gemma4_vision_oracle.py");

function noise(w: number, h: number, ch: number, seed: number): Buffer {
  const b = Buffer.alloc(w * h * ch);
  let s = seed >>> 0;
  for (let i = 0; i < b.length; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    // smooth gradient plus noise, so resampling has structure to work on
    const p = Math.floor(i / ch);
    b[i] = (((p % w) * 3 + Math.floor(p / w) * 2 + (s >>> 24) / 4) & 255) >>> 0;
  }
  return b;
}

let dir: string;
const files: Record<string, string> = {};

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "mlxb-vision-pre-"));
  // A processor config with the published budget (280 soft tokens) and one with a small one.
  writeFileSync(
    join(dir, "processor_config.json"),
    JSON.stringify({ image_processor: { max_soft_tokens: 280, patch_size: 16, pooling_kernel_size: 3, do_normalize: false, rescale_factor: 1 / 255 } }),
  );
  const mk = async (name: string, w: number, h: number, ch: 1 | 2 | 3 | 4, enc: (s: sharp.Sharp) => sharp.Sharp) => {
    const p = join(dir, name);
    await enc(sharp(noise(w, h, ch, w * 31 + h), { raw: { width: w, height: h, channels: ch } })).toFile(p);
    files[name] = p;
  };
  await mk("down.png", 1000, 700, 3, (s) => s.png()); // downscale
  await mk("up.png", 60, 45, 3, (s) => s.png()); // upscale
  await mk("tall.png", 20, 900, 3, (s) => s.png()); // target width 0 -> the fallback branch
  await mk("square.png", 480, 480, 3, (s) => s.png()); // already a multiple: no resize
  await mk("grey.png", 333, 251, 1, (s) => s.png());
  await mk("rgba.png", 300, 200, 4, (s) => s.png());
  await mk("photo.jpg", 640, 427, 3, (s) => s.jpeg({ quality: 90 }));
  await mk("rotated.jpg", 320, 200, 3, (s) => s.jpeg({ quality: 95 }).withMetadata({ orientation: 6 }));
  await mk("pic.webp", 500, 260, 3, (s) => s.webp({ lossless: true }));
});

afterAll(() => rmSync(dir, { recursive: true, force: true }));

function reference(names: string[]): { pixels: Float32Array[]; shapes: number[][]; soft: number[] } {
  const out = join(dir, `ref-${names.length}-${names[0]}.safetensors`);
  runPython([ORACLE, "pixels", dir, out, ...names.map((n) => files[n]!)]);
  using l = loadSafetensors(out);
  const pixels: Float32Array[] = [];
  const shapes: number[][] = [];
  names.forEach((_, i) => {
    const a = l.tensors.get(`pixels.${i}`)!;
    a.eval();
    shapes.push([...a.shape]);
    pixels.push(a.toTypedArray() as Float32Array);
  });
  return { pixels, shapes, soft: JSON.parse(l.metadata.soft_tokens!) as number[] };
}

describe("Gemma 4 image preprocessing = mlx-vlm's processor", () => {
  it("the config is read as Gemma4Processor.from_pretrained reads it", () => {
    const c: ImageProcessorConfig = loadImageProcessorConfig(dir);
    expect(c).toEqual({ ...DEFAULT_IMAGE_PROCESSOR, maxSoftTokens: 280, imageMean: [0.5, 0.5, 0.5], imageStd: [0.5, 0.5, 0.5] });
  });

  it("lossless files (PNG, WebP; RGB, grey, RGBA; down, up, extreme aspect, no resize): pixel values bit-identical", async () => {
    const names = ["down.png", "up.png", "tall.png", "square.png", "grey.png", "rgba.png", "pic.webp"];
    const ref = reference(names);
    const cfg = loadImageProcessorConfig(dir);
    for (const [i, n] of names.entries()) {
      const img = await decodeImage(readFileSync(files[n]!));
      const p = preprocessImage(img, cfg);
      expect([3, p.height, p.width], n).toEqual(ref.shapes[i]);
      expect(p.softTokens, n).toBe(ref.soft[i]);
      let diff = 0;
      for (let j = 0; j < p.pixels.length; j++) if (p.pixels[j] !== ref.pixels[i]![j]) diff++;
      expect(diff, `${n}: ${diff} of ${p.pixels.length} values differ`).toBe(0);
    }
  });

  it("JPEG (plain and EXIF-rotated): pixel values bit-identical", async () => {
    const names = ["photo.jpg", "rotated.jpg"];
    const ref = reference(names);
    const cfg = loadImageProcessorConfig(dir);
    for (const [i, n] of names.entries()) {
      const img = await decodeImage(readFileSync(files[n]!));
      const p = preprocessImage(img, cfg);
      expect([3, p.height, p.width], n).toEqual(ref.shapes[i]);
      expect(p.softTokens).toBe(ref.soft[i]);
      let maxAbs = 0;
      let diff = 0;
      for (let j = 0; j < p.pixels.length; j++) {
        const d = Math.abs(p.pixels[j]! - ref.pixels[i]![j]!);
        if (d > 0) diff++;
        maxAbs = Math.max(maxAbs, d);
      }
      // Pillow's libjpeg-turbo and sharp's mozjpeg use the same integer IDCT and fancy upsampling.
      expect(maxAbs, `${n}: ${diff} values differ, max ${maxAbs * 255} steps`).toBe(0);
    }
  });

  it("the target size follows get_aspect_ratio_preserving_size", () => {
    expect(aspectRatioPreservingSize(700, 1000, 16, 280 * 9, 3)).toEqual({ height: 672, width: 960 });
    expect(() => aspectRatioPreservingSize(1, 1, 16, 9, 3)).not.toThrow();
  });

  it("bad input is an ImageError naming the problem", async () => {
    const bad = async (b: Uint8Array, code: string, re: RegExp, maxPixels?: number) => {
      const e = await decodeImage(b, maxPixels ? { maxPixels } : {}).catch((x: unknown) => x);
      expect(e).toBeInstanceOf(ImageError);
      expect((e as ImageError).code).toBe(code);
      expect((e as ImageError).message).toMatch(re);
    };
    await bad(new Uint8Array(0), "not_an_image", /empty/);
    await bad(new TextEncoder().encode("hello, not an image"), "not_an_image", /not an image/);
    const png = readFileSync(files["down.png"]!);
    await bad(png.subarray(0, Math.floor(png.length / 2)), "truncated", /truncated/);
    const jpg = readFileSync(files["photo.jpg"]!);
    await bad(jpg.subarray(0, Math.floor(jpg.length / 2)), "truncated", /truncated/);
    await bad(png, "too_large", /megapixels/, 1000 * 700);
    // 100 megapixels, declared in the header, refused before decoding (a 10000 x 10000 PNG).
    const big = await sharp({ create: { width: 10000, height: 10000, channels: 3, background: "#000" } })
      .png({ compressionLevel: 9 })
      .toBuffer();
    await bad(big, "too_large", /10000x10000 = 100.0 megapixels/);
  });
});
