// Image requests for gemma4_unified (the 12B's encoder-free vision embedder) through the runtime's
// one image path (src/images.ts: Engine.vision() is loadVisionEncoder's Gemma4UnifiedVision) on the
// tiny checkpoint of tools/make-tiny-model/make_tiny_vision_model.py --variant u. Reference:
// mlx-vlm 0.7.10 (tools/oracle/gemma4_vision_oracle.py `run`: mlx_vlm.generate's whole-prompt
// prefill, then greedy steps through the language model's cache; and `generate`, mlx_vlm.generate's
// stream_generate itself).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { memory } from "@mlx-bun/mlx-ffi";
import { afterAll, beforeAll, expect, test } from "vitest";
import { Engine, type GenerateRequest, Scheduler } from "../src/index.ts";
import { imageReference, makeVisionFixtures, soloImageRuns, tokens } from "./image-requests.ts";

const N = 10;
let dir: string;
let ckpt: string;
const files: string[] = [];

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "mlxb-images-unified-"));
  ckpt = join(dir, "vision-u");
  files.push(...makeVisionFixtures(dir, ["--variant", "u", "--out", ckpt]));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

test("gemma4_unified image requests alone and batched with text: greedy tokens equal mlx-vlm's; memory back to baseline", async () => {
  const refA = imageReference(dir, ckpt, files[0]!, N);
  const refB = imageReference(dir, ckpt, files[1]!, N);
  expect(refA.tokens).not.toEqual(refB.tokens);
  // mlx_vlm.generate tokenizes the rendered prompt with a second <bos> (its prepare_inputs cannot
  // pass add_special_tokens=False to Gemma4Processor.__call__), so its tokens differ from `run`'s
  // (the template's one <bos>, as the server and the CLI tokenize); with that extra <bos> in
  // the prompt ids, the runtime gives mlx_vlm.generate's tokens (below).
  using e = Engine.load(ckpt);
  const { reqA, reqB, baseline, handles } = await soloImageRuns(e, [refA, refB], files, N);
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
