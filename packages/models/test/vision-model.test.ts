// The vision tower, the multimodal embedder and image prompts against mlx-vlm 0.7.10 on tiny
// random Gemma 4 vision checkpoints (tools/make-tiny-model/make_tiny_vision_model.py: "e" with
// clipped linears and causal text attention, "l" with standardize and bidirectional image
// attention). Reference: tools/oracle/gemma4_vision_oracle.py run (processor + Model.__call__ +
// greedy decode through the language model's cache).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runPython } from "../../../tools/oracle/oracle.ts";
import { Gemma4Vision } from "../src/vision/tower.ts";
import { ROOT } from "./helpers.ts";
import { expectImageCase, warmUpVision, writeTestPng } from "./vision-parity.ts";

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
  const ckpt = join(dir, "vision-e");
  await warmUpVision(ckpt, images[0]!, (lm) => Gemma4Vision.load(ckpt, lm.config));
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
