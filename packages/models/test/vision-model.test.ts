// The vision tower, the multimodal embedder and image prompts against mlx-vlm 0.7.10 on tiny
// random Gemma 4 vision checkpoints (tools/make-tiny-model/make_tiny_vision_model.py: "e" with
// clipped linears and causal text attention, "l" with standardize and bidirectional image
// attention). Reference: tools/oracle/gemma4_vision_oracle.py run (processor + Model.__call__ +
// greedy decode through the language model's cache).
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import * as mx from "@mlx-bun/mlx-ops";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runPython } from "../../../tools/oracle/oracle.ts";
import { loadModel } from "../src/load.ts";
import { multimodalInputs, expandImageTokens } from "../src/vision/embed.ts";
import { decodeImage, loadImageProcessorConfig, preprocessImage } from "../src/vision/preprocess.ts";
import { Gemma4Vision } from "../src/vision/tower.ts";
import { ROOT } from "./helpers.ts";
import { expectImageCase, writeTestPng } from "./vision-parity.ts";

const MAKER = join(ROOT, "tools", "make-tiny-model", "make_tiny_vision_model.py");
const STEPS = 12;

let dir: string;
const images: string[] = [];

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "mlxb-vision-model-"));
  runPython([MAKER, "--suite", dir]);
  const mk = async (name: string, w: number, h: number, seed: number) => images.push(await writeTestPng(dir, name, w, h, seed));
  await mk("a.png", 130, 100, 1);
  await mk("b.png", 64, 200, 2);
  // Warm-up: the process-lived compiled functions (gelu_approx, geglu, softcap) are made on first
  // use; the memory checks below then see only what one request leaves behind.
  const ckpt = join(dir, "vision-e");
  using lm = loadModel(ckpt);
  using vision = Gemma4Vision.load(ckpt, lm.config)!;
  const pre = preprocessImage(await decodeImage(readFileSync(images[0]!)), loadImageProcessorConfig(ckpt));
  using f = vision.encode(pre);
  const ids = expandImageTokens([2, vision.tokens.imageTokenId, 5], [pre.softTokens], vision.tokens);
  using mm = multimodalInputs(lm.model, vision.tokens, ids, [f]);
  using idsArr = mx.array([ids], "int32");
  using l = lm.model.forward(idsArr, null, mm.inputs);
  l.eval();
});

afterAll(() => rmSync(dir, { recursive: true, force: true }));

const CASES = [
  { name: "one image", content: [{ type: "image" }, { type: "text", text: "What is in this picture?" }], images: [0] },
  {
    name: "two images with text between",
    content: [{ type: "text", text: "Compare" }, { type: "image" }, { type: "text", text: "and" }, { type: "image" }],
    images: [0, 1],
  },
];

describe.each(["vision-e", "vision-l"])("%s = mlx-vlm", (variant) => {
  it.each(CASES)("$name: prompt ids, soft tokens, prefill logits and greedy tokens equal", (c) =>
    expectImageCase({
      work: dir,
      ckpt: join(dir, variant),
      content: c.content,
      images: c.images.map((i) => images[i]!),
      steps: STEPS,
      encoder: (lm) => {
        const v = Gemma4Vision.load(join(dir, variant), lm.config);
        expect(v).not.toBeNull();
        return v!;
      },
    }),
  );
});
