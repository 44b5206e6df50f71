// Image requests through the one decode pipeline (src/images.ts, docs/images.md "Runtime") on the
// tiny Gemma 4 vision checkpoints of tools/make-tiny-model/make_tiny_vision_model.py ("e": causal,
// "l": bidirectional image attention). Reference: mlx_vlm.generate's stream_generate, greedy
// (tools/oracle/gemma4_vision_oracle.py generate), for the same messages and image files.
import { join } from "node:path";
import { memory } from "@mlx-bun/mlx-ffi";
import { parseMultimodalTokens, type PreprocessedImage } from "@mlx-bun/models";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { Engine, type GenerateRequest, PromptCache, RequestError, Scheduler } from "../src/index.ts";
import { tinyModels } from "./helpers.ts";
import { imageReference, makeVisionFixtures, soloImageRuns, tokens } from "./image-requests.ts";

const N = 10;
let models: ReturnType<typeof tinyModels>;
let dir: string;
const files: string[] = [];

beforeAll(async () => {
  models = tinyModels({ text: ["--variant", "small"] });
  dir = join(models.path("text"), "..");
  files.push(...makeVisionFixtures(dir, ["--suite", dir]));
});
afterAll(() => models.cleanup());

describe.each(["vision-e", "vision-l"])("%s: image requests = mlx_vlm.generate", (variant) => {
  test("alone, beside text requests in a batch, and with a prompt cache: greedy tokens equal mlx-vlm's; memory back to baseline", async () => {
    const ckpt = join(dir, variant);
    const refA = imageReference(dir, ckpt, files[0]!, N);
    const refB = imageReference(dir, ckpt, files[1]!, N);
    expect(refA.tokens).not.toEqual(refB.tokens);
    // mlx_vlm.generate agrees with its Model.__call__ path on the causal checkpoint; on the
    // bidirectional one (vision-l) it does not, because it tokenizes the prompt with a second <bos>
    // (docs/images.md §4; images-unified.test.ts checks that case), so the reference is __call__.
    if (variant === "vision-e") {
      expect(refA.generated).toEqual(refA.tokens);
      expect(refB.generated).toEqual(refB.tokens);
    }
    using e = Engine.load(ckpt);
    const { reqA, reqB, baseline, handles } = await soloImageRuns(e, [refA, refB], files, N);
    // Batched: two text requests and both image requests at once (and again: the prompt cache holds
    // every prompt, the image ones keyed by their images' content: images-prompt-cache.test.ts).
    const cache = new PromptCache({ maxEntries: 8, maxBytes: 1 << 30 });
    const sched = new Scheduler(e, { maxBatch: 8, promptCache: cache });
    const text = (i: number): GenerateRequest => ({ promptIds: Array.from({ length: 9 + i }, (_, j) => 3 + ((j * 37 + i) % 200)), maxTokens: N });
    const textAlone = [await tokens(e.generate(text(0))), await tokens(e.generate(text(1)))];
    for (let round = 0; round < 2; round++) {
      const got = await Promise.all([tokens(sched.submit(text(0))), tokens(sched.submit(reqA)), tokens(sched.submit(text(1))), tokens(sched.submit(reqB))]);
      expect(got[0], `round ${round}: text 0`).toEqual(textAlone[0]);
      expect(got[1], `round ${round}: image a`).toEqual(refA.tokens);
      expect(got[2], `round ${round}: text 1`).toEqual(textAlone[1]);
      expect(got[3], `round ${round}: image b`).toEqual(refB.tokens);
    }
    // An image request joining a running batch (prefilled alone, decoded with the others).
    const late = tokens(sched.submit({ ...text(2), maxTokens: 3 * N }));
    await Bun.sleep(20);
    expect(await tokens(sched.submit(reqA))).toEqual(refA.tokens);
    await late;
    await sched.close();
    expect(cache.size).toBeGreaterThan(0);
    cache.dispose();
    memory.clearCache();
    expect(memory.liveHandles()).toBe(handles);
    expect(memory.active()).toBe(baseline);
  });
});

test("refused: images for a model without a vision tower, a prompt whose image tokens do not match its images", async () => {
  using text = Engine.load(models.path("text"));
  const pre: PreprocessedImage = { pixels: new Float32Array(3 * 48 * 48), width: 48, height: 48, softTokens: 1 };
  expect(() => text.generate({ promptIds: [2, 5, 6], maxTokens: 2, images: [pre] })).toThrow(/has no vision tower/);
  using e = Engine.load(join(dir, "vision-e"));
  const t = parseMultimodalTokens(e.loaded.config);
  expect(() => e.generate({ promptIds: [2, 5, 6], maxTokens: 2, images: [pre] })).toThrow(RequestError);
  expect(() => e.generate({ promptIds: [2, t.imageTokenId, t.imageTokenId, 6], maxTokens: 2, images: [pre] })).toThrow(/2 image tokens, the image gives 1/);
  expect(() => e.generate({ promptIds: [2, t.imageTokenId], maxTokens: 2, images: [pre] })).toThrow(/must not end with an image token/);
  expect(() => e.generate({ promptIds: [2, t.imageTokenId, 6], maxTokens: 2, images: [{ ...pre, pixels: new Float32Array(3) }] })).toThrow(
    /not a preprocessed image/,
  );
});
