// The image-parity check both encoders' tests run against tools/oracle/gemma4_vision_oracle.py `run`:
// soft tokens, prefill logits, every greedy step's logits (max |diff| = 0) and the tokens.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { loadSafetensors, type MlxArray, memory } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import sharp from "sharp";
import { expect } from "vitest";
import { runPython } from "../../../tools/oracle/oracle.ts";
import { type LoadedModel, loadModel } from "../src/load.ts";
import { expandImageTokens, multimodalInputs } from "../src/vision/embed.ts";
import type { VisionEncoder } from "../src/vision/encoder.ts";
import { decodeImage, loadImageProcessorConfig, type PreprocessedImage, preprocessImage } from "../src/vision/preprocess.ts";
import { ROOT } from "./helpers.ts";

export const VISION_ORACLE = join(ROOT, "tools", "oracle", "gemma4_vision_oracle.py");

/**
 * One image through `ckpt`'s encoder and model: the process-lived compiled functions (gelu_approx,
 * geglu, softcap) are made on first use, so memory checks after it see only what one request leaves.
 */
export async function warmUpVision(ckpt: string, png: string, loadEncoder: (lm: LoadedModel) => VisionEncoder | null): Promise<void> {
  using lm = loadModel(ckpt);
  using vision = loadEncoder(lm)!;
  const pre = preprocessImage(await decodeImage(readFileSync(png)), loadImageProcessorConfig(ckpt));
  using f = vision.encode(pre);
  const ids = expandImageTokens([2, vision.tokens.imageTokenId, 5], [pre.softTokens], vision.tokens);
  using mm = multimodalInputs(lm.model, vision.tokens, ids, [f]);
  using idsArr = mx.array([ids], "int32");
  using l = lm.model.forward(idsArr, null, mm.inputs);
  l.eval();
}

function argmax(a: MlxArray): number {
  using m = mx.argmax(a);
  return (m.item() as number) | 0;
}

export function maxAbsDiff(a: MlxArray, b: MlxArray): number {
  using af = mx.astype(a, "float32");
  using bf = mx.astype(b, "float32");
  using br = mx.reshape(bf, af.shape);
  using d = mx.subtract(af, br);
  using ad = mx.abs(d);
  using m = mx.max(ad);
  return m.item() as number;
}

/**
 * Encode `pre`, prefill `ids` with the soft tokens placed, decode `steps` greedy tokens; each
 * against the oracle's `ref` tensors (features, prefill_logits, step_logits, tokens), bit for bit.
 * `bidirectional`: whether the inputs must carry the image attention masks.
 */
export function expectImageParity(
  lm: LoadedModel,
  vision: VisionEncoder,
  ids: number[],
  pre: readonly PreprocessedImage[],
  ref: ReadonlyMap<string, MlxArray>,
  steps: number,
  bidirectional?: boolean,
): void {
  const feats = pre.map((p) => vision.encode(p));
  try {
    using all = mx.concatenate(feats, 0);
    expect(maxAbsDiff(all, ref.get("features")!), "soft tokens").toBe(0);
    using mm = multimodalInputs(lm.model, vision.tokens, ids, feats);
    if (bidirectional !== undefined) expect(mm.inputs.masks !== undefined, "image attention masks").toBe(bidirectional);
    const caches = lm.model.makeCaches();
    try {
      using idsArr = mx.array([ids], "int32");
      using logits = lm.model.forward(idsArr, caches, mm.inputs);
      using last = mx.index(logits, 0, -1);
      expect(maxAbsDiff(last, ref.get("prefill_logits")!), "prefill logits").toBe(0);
      const tokens: number[] = [];
      let y = argmax(last);
      const refSteps = ref.get("step_logits")!;
      for (let i = 0; i < steps; i++) {
        tokens.push(y);
        using t = mx.array([[y]], "int32");
        using l = lm.model.forward(t, caches);
        using row = mx.index(l, 0, -1);
        using r = mx.index(refSteps, i);
        expect(maxAbsDiff(row, r), `step ${i} logits`).toBe(0);
        y = argmax(row);
      }
      expect(tokens).toEqual([...(ref.get("tokens")!.toTypedArray() as Int32Array)]);
    } finally {
      for (const k of caches) k.dispose();
    }
  } finally {
    for (const f of feats) f.dispose();
  }
}

/** A w x h PNG of pseudo-random pixels (a linear congruential generator seeded by `seed`) at dir/name. */
export async function writeTestPng(dir: string, name: string, w: number, h: number, seed: number): Promise<string> {
  const b = Buffer.alloc(w * h * 3);
  let s = seed;
  for (let i = 0; i < b.length; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    b[i] = ((i % (w * 3)) + (s >>> 26)) & 255;
  }
  const p = join(dir, name);
  await sharp(b, { raw: { width: w, height: h, channels: 3 } })
    .png()
    .toFile(p);
  return p;
}

/**
 * One image case end to end against the oracle's `run` (written under `work`): the prompt ids
 * (the reference's rendered text tokenized here, image tokens expanded here), then
 * expectImageParity; MLX memory and live handles back to their baseline after.
 * `encoder` loads the checkpoint's image encoder (and may check what it got).
 */
export async function expectImageCase(o: {
  work: string;
  ckpt: string;
  content: unknown[];
  images: string[];
  steps: number;
  encoder: (lm: LoadedModel) => VisionEncoder;
  bidirectional?: boolean;
}): Promise<void> {
  const req = join(o.work, "req.json");
  const out = join(o.work, "out.safetensors");
  writeFileSync(req, JSON.stringify({ messages: [{ role: "user", content: o.content }], images: o.images, steps: o.steps }));
  runPython([VISION_ORACLE, "run", o.ckpt, out, req]);
  using ref = loadSafetensors(out);
  for (const a of ref.tensors.values()) a.eval();

  memory.clearCache();
  const baseline = memory.active();
  const handles = memory.liveHandles();
  {
    using lm = loadModel(o.ckpt);
    using vision = o.encoder(lm);
    const cfg = loadImageProcessorConfig(o.ckpt);
    const pre = await Promise.all(o.images.map(async (p) => preprocessImage(await decodeImage(readFileSync(p)), cfg)));
    const ids = expandImageTokens(
      lm.tokenizer.encode(ref.metadata.prompt!, { addSpecialTokens: false }),
      pre.map((p) => p.softTokens),
      vision.tokens,
    );
    expect(ids).toEqual([...(ref.tensors.get("input_ids")!.toTypedArray() as Int32Array)]);
    expectImageParity(lm, vision, ids, pre, ref.tensors, o.steps, o.bidirectional);
  }
  memory.clearCache();
  expect(memory.liveHandles()).toBe(handles);
  expect(memory.active()).toBe(baseline);
}
