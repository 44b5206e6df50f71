// Image requests for gemma4_unified (the 12B's encoder-free vision embedder) through the runtime's
// one image path (src/images.ts: Engine.vision() is loadVisionEncoder's Gemma4UnifiedVision) on the
// tiny checkpoint of tools/make-tiny-model/make_tiny_vision_model.py --variant u. Reference:
// mlx-vlm 0.7.10 (tools/oracle/gemma4_vision_oracle.py `run`: mlx_vlm.generate's whole-prompt
// prefill, then greedy steps through the language model's cache; and `generate`, mlx_vlm.generate's
// stream_generate itself).
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadSafetensors, memory } from "@mlx-bun/mlx-ffi";
import { decodeImage, expandImageTokens, loadImageProcessorConfig, parseMultimodalTokens, type PreprocessedImage, preprocessImage } from "@mlx-bun/models";
import { afterAll, beforeAll, expect, test } from "vitest";
import { runPython } from "../../../tools/oracle/oracle.ts";
import { Engine, type GenerateRequest, Scheduler } from "../src/index.ts";
import { ROOT } from "./helpers.ts";

const ORACLE = join(ROOT, "tools", "oracle", "gemma4_vision_oracle.py");
const N = 10;
let dir: string;
let ckpt: string;
const files: string[] = [];

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "mlxb-images-unified-"));
  ckpt = join(dir, "vision-u");
  runPython([join(ROOT, "tools", "make-tiny-model", "make_tiny_vision_model.py"), "--variant", "u", "--out", ckpt]);
  const py = `import sys, numpy as np; from PIL import Image
for i, (w, h) in enumerate([(130, 100), (64, 200)]):
    Image.fromarray(np.random.default_rng(i + 1).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(sys.argv[1] + f"/{'ab'[i]}.png")`;
  runPython(["-c", py, dir]);
  files.push(join(dir, "a.png"), join(dir, "b.png"));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const content = [{ type: "image" }, { type: "text", text: "What is in this picture?" }];

function reference(image: string): { prompt: string; tokens: number[]; generated: number[] } {
  const req = join(dir, "gen.json");
  writeFileSync(req, JSON.stringify({ messages: [{ role: "user", content }], images: [image], max_tokens: N, steps: N }));
  const gen = JSON.parse(runPython([ORACLE, "generate", ckpt, req])) as { prompt: string; tokens: number[] };
  const out = join(dir, "run.safetensors");
  runPython([ORACLE, "run", ckpt, out, req]);
  using ref = loadSafetensors(out);
  const tokens = [...(ref.tensors.get("tokens")!.toTypedArray() as Int32Array)];
  return { prompt: gen.prompt, tokens, generated: gen.tokens.slice(0, N) };
}

async function request(e: Engine, prompt: string, image: string): Promise<GenerateRequest> {
  const pre: PreprocessedImage = preprocessImage(await decodeImage(readFileSync(image)), loadImageProcessorConfig(e.loaded.dir));
  const ids = expandImageTokens(e.loaded.tokenizer.encode(prompt, { addSpecialTokens: false }), [pre.softTokens], parseMultimodalTokens(e.loaded.config));
  return { promptIds: ids, maxTokens: N, images: [pre] };
}

async function tokens(s: ReturnType<Scheduler["submit"]>): Promise<number[]> {
  for await (const _ of s) {
  }
  return (await s.result).tokens;
}

test("gemma4_unified image requests alone and batched with text: greedy tokens equal mlx-vlm's; memory back to baseline", async () => {
  const refA = reference(files[0]!);
  const refB = reference(files[1]!);
  expect(refA.tokens).not.toEqual(refB.tokens);
  // mlx_vlm.generate tokenizes the rendered prompt with a second <bos> (its prepare_inputs cannot
  // pass add_special_tokens=False to Gemma4Processor.__call__), so its tokens differ from `run`'s
  // (the template's one <bos>, as the server and the CLI tokenize); with that extra <bos> in
  // the prompt ids, the runtime gives mlx_vlm.generate's tokens (below).
  using e = Engine.load(ckpt);
  const reqA = await request(e, refA.prompt, files[0]!);
  const reqB = await request(e, refB.prompt, files[1]!);
  expect(await tokens(e.generate(reqA))).toEqual(refA.tokens);
  memory.clearCache();
  const baseline = memory.active();
  const handles = memory.liveHandles();
  expect(await tokens(e.generate(reqB))).toEqual(refB.tokens);
  const bos = reqA.promptIds[0]!;
  expect(await tokens(e.generate({ ...reqA, promptIds: [bos, ...reqA.promptIds] }))).toEqual(refA.generated);
  expect(await tokens(e.generate({ ...reqB, promptIds: [bos, ...reqB.promptIds] }))).toEqual(refB.generated);
  const sched = new Scheduler(e, { maxBatch: 4 });
  const text: GenerateRequest = { promptIds: Array.from({ length: 11 }, (_, j) => 3 + ((j * 37) % 200)), maxTokens: N };
  const textAlone = await tokens(e.generate(text));
  const got = await Promise.all([tokens(sched.submit(text)), tokens(sched.submit(reqA)), tokens(sched.submit(reqB))]);
  expect(got).toEqual([textAlone, refA.tokens, refB.tokens]);
  await sched.close();
  memory.clearCache();
  expect(memory.liveHandles()).toBe(handles);
  expect(memory.active()).toBe(baseline);
});
