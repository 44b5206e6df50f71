// Image prompts in the prompt cache (src/images.ts imageCacheKeys, docs/images.md "Runtime"): keyed
// by the images' content, a reused prefix never ends inside an image's run, and KV is never reused
// across different images. Tiny vision checkpoints "e" (causal) and "l" (bidirectional image
// attention), sliding window 8 (wrapped: reuse is by exact extension of a kept snapshot). Reference:
// mlx-vlm (tools/oracle/gemma4_vision_oracle.py `run`) for one image, and for a next turn a cold run
// of the same prompt (a reused prefix gives the tokens of a cold run).
import { join } from "node:path";
import { memory } from "@mlx-bun/mlx-ffi";
import { parseMultimodalTokens } from "@mlx-bun/models";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { runPython } from "../../../tools/oracle/oracle.ts";
import { Engine, type GenerateRequest, imageRuns, PromptCache, Scheduler } from "../src/index.ts";
import { tinyModels } from "./helpers.ts";
import { imageReference, imageRequest, makeVisionFixtures } from "./image-requests.ts";

const N = 8;
let models: ReturnType<typeof tinyModels>;
let dir: string;
let a: string;
let c: string;

beforeAll(() => {
  models = tinyModels({ text: ["--variant", "small"] });
  dir = join(models.path("text"), "..");
  a = makeVisionFixtures(dir, ["--suite", dir])[0]!;
  // A third image of a.png's size (so the same prompt ids), other pixels.
  c = join(dir, "c.png");
  const py = `import sys, numpy as np; from PIL import Image
Image.fromarray(np.random.default_rng(7).integers(0, 256, (100, 130, 3), dtype=np.uint8)).save(sys.argv[1])`;
  runPython(["-c", py, c]);
});
afterAll(() => models.cleanup());

describe.each(["vision-e", "vision-l"])("%s: image prompts in the prompt cache", (variant) => {
  test("same image reused through its run, a different image never past its start, a next turn reuses the image; memory back to baseline", async () => {
    const ckpt = join(dir, variant);
    const refA = imageReference(dir, ckpt, a, N);
    const refC = imageReference(dir, ckpt, c, N);
    expect(refC.tokens).not.toEqual(refA.tokens);
    using e = Engine.load(ckpt);
    const bidirectional = variant === "vision-l";
    // A checkpoint where the image starts: kept on the causal model (the text before the image is
    // shared by every image), dropped on the bidirectional one (its images need a prefill from empty caches).
    const withStart = async (file: string, prompt: string): Promise<GenerateRequest> => {
      const req = await imageRequest(e, prompt, file, N);
      const run = imageRuns(req.promptIds, parseMultimodalTokens(e.loaded.config).imageTokenId)[0]!;
      return { ...req, cacheCheckpoints: [run.start] };
    };
    const reqA = await withStart(a, refA.prompt);
    const reqA2 = await withStart(a, refA.prompt); // decoded again: another object, the same content
    const reqC = await withStart(c, refC.prompt);
    expect(reqC.promptIds).toEqual(reqA.promptIds);
    const run = imageRuns(reqA.promptIds, parseMultimodalTokens(e.loaded.config).imageTokenId)[0]!;
    const n = reqA.promptIds.length;
    // Warm-up (the vision tower loads on first use), and the cold tokens of a next turn.
    const more = e.loaded.tokenizer.encode("<end_of_turn>\n<start_of_turn>user\nAnd now?<end_of_turn>\n<start_of_turn>model\n", { addSpecialTokens: false });
    const turn2: GenerateRequest = { promptIds: [...reqA.promptIds, ...refA.tokens, ...more], maxTokens: N, images: reqA.images! };
    const cold2 = await e.generate(turn2).result;
    expect(cold2.cachedTokens).toBe(0);
    expect((await e.generate(reqA).result).tokens).toEqual(refA.tokens);
    memory.clearCache();
    const baseline = memory.active();
    const handles = memory.liveHandles();

    const cache = new PromptCache({ maxBytes: 1 << 30 });
    const sched = new Scheduler(e, { maxBatch: 4, promptCache: cache });
    const r1 = await sched.submit(reqA).result;
    expect(r1.cachedTokens).toBe(0);
    expect(r1.tokens).toEqual(refA.tokens);
    // The same image again (another decode of the file): all of the prompt but its last token reused, through the image.
    const r2 = await sched.submit(reqA2).result;
    expect(r2.cachedTokens).toBe(n - 1);
    expect(r2.cachedTokens).toBeGreaterThan(run.end);
    expect(r2.tokens).toEqual(refA.tokens);
    // A next turn with the first image in its history reuses the first turn's KV through the image.
    const w2 = await sched.submit(turn2).result;
    expect(w2.cachedTokens).toBeGreaterThanOrEqual(n + N - 1);
    expect(w2.tokens).toEqual(cold2.tokens);
    // The same next turn with another image (same size, same prompt ids) in its history: only the
    // text before the image is reused (causal model; nothing on the bidirectional one).
    const turn2c: GenerateRequest = { ...turn2, images: reqC.images! };
    const w2c = await sched.submit(turn2c).result;
    expect(w2c.cachedTokens).toBe(bidirectional ? 0 : run.start);
    expect(w2c.tokens).toEqual((await e.generate(turn2c).result).tokens);
    // That image's first turn: no reuse past the image's start either; tokens equal mlx-vlm's for it.
    const r3 = await sched.submit(reqC).result;
    expect(r3.cachedTokens).toBe(bidirectional ? 0 : run.start);
    expect(r3.tokens).toEqual(refC.tokens);
    // And that image again: its own entry, through its run.
    const r4 = await sched.submit(reqC).result;
    expect(r4.cachedTokens).toBe(n - 1);
    expect(r4.tokens).toEqual(refC.tokens);
    await sched.close();
    expect(cache.stats.hits).toBeGreaterThanOrEqual(bidirectional ? 3 : 5);
    // Entries keyed through images are not persisted as token ids.
    const snap = cache.snapshot();
    expect(snap.every((s) => s.tokens.every((t) => t >= 0))).toBe(true);
    for (const s of snap) for (const x of s.caches) x.dispose();
    cache.dispose();
    memory.clearCache();
    expect(memory.liveHandles()).toBe(handles);
    expect(memory.active()).toBe(baseline);
  });
});
