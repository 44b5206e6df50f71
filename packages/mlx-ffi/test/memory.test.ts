import { describe, expect, test } from "vitest";
import { MlxArray, evaluate, memory } from "../src/index.ts";

describe("ownership", () => {
  test("10,000 create/dispose cycles leave MLX active memory and handles at baseline", () => {
    // Warm up the allocator and the FFI paths first, then measure.
    MlxArray.fromNumbers([1, 2, 3, 4], [2, 2]).dispose();
    memory.clearCache();
    const baseMem = memory.active();
    const baseHandles = memory.liveHandles();
    for (let i = 0; i < 10_000; i++) {
      using a = MlxArray.fromTypedArray(new Float32Array(256), [16, 16]);
      using b = a.retain();
      if (i % 1000 === 0) {
        evaluate(a, b);
        expect(memory.active()).toBeGreaterThan(baseMem);
      }
    }
    expect(memory.liveHandles()).toBe(baseHandles);
    expect(memory.active()).toBe(baseMem);
  });
});
