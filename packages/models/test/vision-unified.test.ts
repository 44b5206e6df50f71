// gemma4_unified (the 12B, encoder-free) images against mlx-vlm 0.7.10 on a tiny random checkpoint
// (tools/make-tiny-model/make_tiny_vision_model.py --variant u: the 12B's text side scaled down,
// mlx-vlm's own VisionEmbedder with 48-pixel model patches). References:
// tools/oracle/gemma4_vision_oracle.py `pixels` (Gemma4UnifiedImageProcessor: model patches and
// position ids) and `run` (processor + Model.__call__ + greedy decode through the language
// model's cache).
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadSafetensors } from "@mlx-bun/mlx-ffi";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runPython } from "../../../tools/oracle/oracle.ts";
import { loadModel } from "../src/load.ts";
import { decodeImage, loadImageProcessorConfig, preprocessImage } from "../src/vision/preprocess.ts";
import { Gemma4UnifiedVision, loadVisionEncoder, modelPatches, takesImages } from "../src/vision/unified.ts";
import { ROOT } from "./helpers.ts";
import { expectImageCase, VISION_ORACLE, warmUpVision, writeTestPng } from "./vision-parity.ts";

const MAKER = join(ROOT, "tools", "make-tiny-model", "make_tiny_vision_model.py");
const STEPS = 12;

let dir: string;
let ckpt: string;
const images: string[] = [];

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "mlxb-vision-unified-"));
  ckpt = join(dir, "vision-u");
  runPython([MAKER, "--variant", "u", "--out", ckpt]);
  const mk = async (name: string, w: number, h: number, seed: number) => images.push(await writeTestPng(dir, name, w, h, seed));
  await mk("a.png", 130, 100, 1);
  await mk("b.png", 64, 200, 2);
  await mk("c.png", 480, 480, 3); // already a multiple of 48: no resize, 100 patches
  await warmUpVision(ckpt, images[0]!, (lm) => loadVisionEncoder(ckpt, lm.config));
});

afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("gemma4_unified images = mlx-vlm", () => {
  it("model patches and position ids equal Gemma4UnifiedImageProcessor's (padded to its budget)", async () => {
    const out = join(dir, "pixels.safetensors");
    runPython([VISION_ORACLE, "pixels", ckpt, out, ...images]);
    using ref = loadSafetensors(out);
    const counts = JSON.parse(ref.metadata.soft_tokens!) as number[];
    const cfg = loadImageProcessorConfig(ckpt);
    for (const [i, p] of images.entries()) {
      const pre = preprocessImage(await decodeImage(readFileSync(p)), cfg);
      expect(pre.softTokens, `image ${i}: soft tokens`).toBe(counts[i]);
      const mp = modelPatches(pre, cfg.patchSize * cfg.poolingKernelSize, cfg.maxSoftTokens);
      expect(mp.count).toBe(counts[i]);
      const rp = ref.tensors.get(`patches.${i}`)!;
      const rq = ref.tensors.get(`positions.${i}`)!;
      expect(rp.shape).toEqual([cfg.maxSoftTokens, mp.patchDim]);
      expect(Buffer.from((rp.toTypedArray() as Float32Array).buffer).equals(Buffer.from(mp.patches.buffer)), `image ${i}: patches bit-identical`).toBe(true);
      expect([...(rq.toTypedArray() as Int32Array)]).toEqual([...mp.positions]);
    }
  });

  const CASES = [
    { name: "one image", content: [{ type: "image" }, { type: "text", text: "What is in this picture?" }], images: [0] },
    {
      name: "two images with text between",
      content: [{ type: "text", text: "Compare" }, { type: "image" }, { type: "text", text: "and" }, { type: "image" }],
      images: [1, 2],
    },
  ];

  it.each(CASES)("$name: prompt ids, soft tokens, prefill logits and greedy tokens equal", (c) =>
    expectImageCase({
      work: dir,
      ckpt,
      content: c.content,
      images: c.images.map((i) => images[i]!),
      steps: STEPS,
      encoder: (lm) => {
        expect(takesImages(lm.config)).toBe(true);
        const v = loadVisionEncoder(ckpt, lm.config)!;
        expect(v).toBeInstanceOf(Gemma4UnifiedVision);
        return v;
      },
      // use_bidirectional_attention "vision": the image tokens attend to each other, as in
      // mlx_vlm.generate (the oracle's reference path for gemma4_unified).
      bidirectional: true,
    }),
  );

  it("processor_config.json: num_soft_tokens stands for max_soft_tokens where that is absent, as Gemma4UnifiedImageProcessor takes it", () => {
    const d = join(dir, "num-soft-tokens");
    mkdirSync(d);
    writeFileSync(join(d, "processor_config.json"), JSON.stringify({ image_processor: { num_soft_tokens: 140, patch_size: 16, pooling_kernel_size: 3 } }));
    const py = `import json, sys
from mlx_vlm.models.gemma4_unified.processing_gemma4_unified import Gemma4UnifiedImageProcessor
print(Gemma4UnifiedImageProcessor(num_soft_tokens=140, patch_size=16, pooling_kernel_size=3).max_soft_tokens)`;
    const want = Number(runPython(["-c", py]).trim());
    expect(loadImageProcessorConfig(d).maxSoftTokens).toBe(want);
    expect(want).toBe(140);
  });

  it("refuses an image that is not whole model patches, and a processor/config disagreement", () => {
    using lm = loadModel(ckpt);
    using vision = loadVisionEncoder(ckpt, lm.config)!;
    const odd = { pixels: new Float32Array(3 * 48 * 50), width: 50, height: 48, softTokens: 1 };
    expect(() => vision.encode(odd)).toThrow(/not a whole number of 48x48 model patches/);
    const wrong = { pixels: new Float32Array(3 * 96 * 96), width: 96, height: 96, softTokens: 3 };
    expect(() => vision.encode(wrong)).toThrow(/gives 4 model patches but 3 soft tokens/);
  });
});
