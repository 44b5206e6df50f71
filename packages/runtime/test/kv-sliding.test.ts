// Quantized KV modes leave the sliding-window layers in the model's dtype unless kvSliding says
// otherwise (as mlx-lm, whose RotatingKVCache cannot be quantized, and mlx-vlm's TurboQuant, which
// skips it): the Engine's caches per layer type, and its greedy tokens against the model-level path.
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import type { Cache } from "@mlx-bun/kv-cache";
import { parseKvMode } from "@mlx-bun/models";
import { Engine, Scheduler } from "../src/index.ts";
import { disposeCaches, greedy, promptIds } from "./kv-helpers.ts";
import { tinyModels } from "./helpers.ts";

let models: ReturnType<typeof tinyModels>;
beforeAll(() => {
  // Head dim 64 on both layer types, so every mode can hold the sliding layers too; float32 so
  // that no near-tie flips a greedy pick between the two paths.
  models = tinyModels({ small64: ["--variant", "small", "--dtype", "float32", "--set", "head_dim=64"] });
});
afterAll(() => models.cleanup());

const codecNames = (caches: Cache[]): string[] => caches.map((c) => (c as unknown as { codec: { name: string } }).codec.name);
const CODEC: Record<string, string> = { "turbo:4,3": "kv:turboquant:4:3", q8: "kv:quant:8:64", bf16: "kv:plain" };
// Longer than the tiny model's window (8) and the prefill step: the rotating caches wrap.
const PROMPT = promptIds(29);
const STEPS = 12;

describe("kv quantizes the full-attention layers; the sliding layers keep the model dtype unless kvSliding is given", () => {
  for (const kv of ["turbo:4,3", "q8"]) {
    test(`${kv}: caches per layer type, the mode's name, an explicit kvSliding; greedy tokens equal makeCaches(mode, { slidingMode: bf16 })`, async () => {
      using e = Engine.load(models.path("small64"), { kv });
      const types = e.loaded.config.text.layerTypes;
      expect(types).toContain("sliding_attention");
      expect(e.kvSlidingMode).toEqual({ kind: "bf16" });
      expect(e.kvModeName).toBe(`${kv} (sliding layers bf16)`);
      const caches = e.makeCaches();
      try {
        expect(codecNames(caches)).toEqual(caches.map((_, i) => (types[i] === "full_attention" ? CODEC[kv] : "kv:plain")));
      } finally {
        disposeCaches(caches);
      }

      // An explicit kvSliding quantizes them as before: the same mode is all layers (no sliding mode of its own).
      using all = Engine.load(models.path("small64"), { kv, kvSliding: kv });
      expect(all.kvSlidingMode).toBeUndefined();
      expect(all.kvModeName).toBe(kv);
      const allCaches = all.makeCaches();
      try {
        expect(codecNames(allCaches)).toEqual(allCaches.map(() => CODEC[kv]));
      } finally {
        disposeCaches(allCaches);
      }
      // The scheduler's KV estimate counts the sliding layers at their own mode: more bytes than all-quantized, fewer than bf16.
      using plain = Engine.load(models.path("small64"));
      const bytes = (x: Engine) => new Scheduler(x).bytesFor(PROMPT.length, STEPS);
      expect(bytes(e)).toBeGreaterThan(bytes(all));
      expect(bytes(e)).toBeLessThan(bytes(plain));
      using other = Engine.load(models.path("small64"), { kv, kvSliding: kv === "q8" ? "turbo:4,3" : "q8" });
      const otherCaches = other.makeCaches();
      try {
        expect(codecNames(otherCaches)).toEqual(otherCaches.map((_, i) => CODEC[types[i] === "full_attention" ? kv : kv === "q8" ? "turbo:4,3" : "q8"]));
      } finally {
        disposeCaches(otherCaches);
      }

      // The Engine's greedy tokens (prefill of all but the last prompt token, then decode) equal the
      // model-level path's with the sliding layers bf16, fed alike.
      const got = (await e.generate({ promptIds: PROMPT, maxTokens: STEPS, sampling: { temperature: 0 } }).result).tokens;
      const ref = e.loaded.model.makeCaches(parseKvMode(kv), { slidingMode: { kind: "bf16" } });
      try {
        using run = greedy(e.loaded.model, ref, PROMPT, STEPS, PROMPT.length - 1);
        expect(got).toEqual(run.tokens);
      } finally {
        disposeCaches(ref);
      }
      // With all layers quantized, the tokens are the all-layer model-level path's.
      const gotAll = (await all.generate({ promptIds: PROMPT, maxTokens: STEPS, sampling: { temperature: 0 } }).result).tokens;
      const refAll = all.loaded.model.makeCaches(parseKvMode(kv));
      try {
        using run = greedy(all.loaded.model, refAll, PROMPT, STEPS, PROMPT.length - 1);
        expect(gotAll).toEqual(run.tokens);
      } finally {
        disposeCaches(refAll);
      }
    });
  }

  test("bf16: no sliding mode of its own unless kvSliding gives one", () => {
    using e = Engine.load(models.path("small64"));
    expect(e.kvSlidingMode).toBeUndefined();
    expect(e.kvModeName).toBe("bf16");
    using q = Engine.load(models.path("small64"), { kv: "bf16", kvSliding: "q8" });
    expect(q.kvSlidingMode).toEqual(parseKvMode("q8"));
    expect(q.kvModeName).toBe("bf16 (sliding layers q8)");
  });
});
