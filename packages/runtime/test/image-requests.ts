// What the runtime's image tests share: tiny vision checkpoints with two PNGs, mlx-vlm's prompt and
// tokens for one image (tools/oracle/gemma4_vision_oracle.py), and an image GenerateRequest.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { loadSafetensors, memory } from "@mlx-bun/mlx-ffi";
import { decodeImage, expandImageTokens, loadImageProcessorConfig, parseMultimodalTokens, type PreprocessedImage, preprocessImage } from "@mlx-bun/models";
import { runPython } from "../../../tools/oracle/oracle.ts";
import { expect } from "vitest";
import type { Engine, GenerateRequest, Scheduler } from "../src/index.ts";
import { ROOT } from "./helpers.ts";

const ORACLE = join(ROOT, "tools", "oracle", "gemma4_vision_oracle.py");
const CONTENT = [{ type: "image" }, { type: "text", text: "What is in this picture?" }];

/** tools/make-tiny-model/make_tiny_vision_model.py with `args`, and two PNGs of pseudo-random pixels in `dir` (Pillow: the runtime does not depend on sharp). */
export function makeVisionFixtures(dir: string, args: string[]): string[] {
  runPython([join(ROOT, "tools", "make-tiny-model", "make_tiny_vision_model.py"), ...args]);
  const py = `import sys, numpy as np; from PIL import Image
for i, (w, h) in enumerate([(130, 100), (64, 200)]):
    Image.fromarray(np.random.default_rng(i + 1).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(sys.argv[1] + f"/{'ab'[i]}.png")`;
  runPython(["-c", py, dir]);
  return [join(dir, "a.png"), join(dir, "b.png")];
}

/**
 * mlx-vlm's prompt text and greedy tokens for one image and `n` steps: `run` (Model.__call__ on the
 * prompt, then greedy steps through the language model's cache) and mlx_vlm.generate's
 * stream_generate (`generated`).
 */
export function imageReference(dir: string, ckpt: string, image: string, n: number): { prompt: string; tokens: number[]; generated: number[] } {
  const req = join(dir, "gen.json");
  writeFileSync(req, JSON.stringify({ messages: [{ role: "user", content: CONTENT }], images: [image], max_tokens: n, steps: n }));
  const gen = JSON.parse(runPython([ORACLE, "generate", ckpt, req])) as { prompt: string; tokens: number[] };
  const out = join(dir, "run.safetensors");
  runPython([ORACLE, "run", ckpt, out, req]);
  using ref = loadSafetensors(out);
  const tokens = [...(ref.tensors.get("tokens")!.toTypedArray() as Int32Array)];
  return { prompt: gen.prompt, tokens, generated: gen.tokens.slice(0, n) };
}

/** The request for `prompt` with `image`'s placeholder expanded to its soft tokens. */
export async function imageRequest(e: Engine, prompt: string, image: string, n: number): Promise<GenerateRequest> {
  const pre: PreprocessedImage = preprocessImage(await decodeImage(readFileSync(image)), loadImageProcessorConfig(e.loaded.dir));
  const ids = expandImageTokens(e.loaded.tokenizer.encode(prompt, { addSpecialTokens: false }), [pre.softTokens], parseMultimodalTokens(e.loaded.config));
  return { promptIds: ids, maxTokens: n, images: [pre] };
}

/** A stream's tokens once it ends. */
export async function tokens(s: ReturnType<Scheduler["submit"]>): Promise<number[]> {
  for await (const _ of s) {
  }
  return (await s.result).tokens;
}

type Reference = ReturnType<typeof imageReference>;

/**
 * Both images' requests alone, each equal to its reference's tokens: A first (it loads the vision
 * tower and makes the process-lived compiled functions), then the memory baseline, then B.
 */
export async function soloImageRuns(
  e: Engine,
  [refA, refB]: readonly [Reference, Reference],
  [fileA, fileB]: readonly string[],
  n: number,
): Promise<{ reqA: GenerateRequest; reqB: GenerateRequest; baseline: number; handles: number }> {
  const reqA = await imageRequest(e, refA.prompt, fileA!, n);
  const reqB = await imageRequest(e, refB.prompt, fileB!, n);
  expect(await tokens(e.generate(reqA))).toEqual(refA.tokens);
  memory.clearCache();
  const baseline = memory.active();
  const handles = memory.liveHandles();
  expect(await tokens(e.generate(reqB))).toEqual(refB.tokens);
  return { reqA, reqB, baseline, handles };
}
