// The image-parity check both encoders' tests run against tools/oracle/gemma4_vision_oracle.py `run`:
// soft tokens, prefill logits, every greedy step's logits (max |diff| = 0) and the tokens.
import type { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { join } from "node:path";
import sharp from "sharp";
import { expect } from "vitest";
import type { LoadedModel } from "../src/load.ts";
import { multimodalInputs } from "../src/vision/embed.ts";
import type { VisionEncoder } from "../src/vision/encoder.ts";
import type { PreprocessedImage } from "../src/vision/preprocess.ts";

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
