import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import {
  MlxArray,
  Stream,
  asyncEval,
  defaultDevice,
  evaluate,
  isAvailable,
  isDeviceAvailable,
  loadSafetensors,
  memory,
  mlxVersion,
  saveSafetensors,
  setDefaultDevice,
  synchronize,
  waitFor,
} from "../src/index.ts";

const dir = mkdtempSync(join(tmpdir(), "mlxb-eval-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function lazyArrays(n: number): { arrays: MlxArray[]; dispose(): void } {
  const path = join(dir, `lazy-${n}.safetensors`);
  const src: Record<string, MlxArray> = {};
  for (let i = 0; i < n; i++) src[`t${i}`] = MlxArray.fromNumbers([i, i + 1, i + 2], [3], "float32");
  saveSafetensors(path, src);
  for (const a of Object.values(src)) a.dispose();
  const loaded = loadSafetensors(path);
  const arrays = [...loaded.tensors.values()];
  return { arrays, dispose: () => loaded[Symbol.dispose]() };
}

describe("evaluation", () => {
  test("a lazy graph is computed on eval, many arrays in one call", () => {
    const { arrays, dispose } = lazyArrays(4);
    try {
      expect(arrays.every((a) => !isAvailable(a))).toBe(true);
      evaluate(...arrays);
      expect(arrays.every((a) => isAvailable(a))).toBe(true);
      expect(arrays[2]!.tolist()).toEqual([2, 3, 4]);
    } finally {
      dispose();
    }
  });

  test("async eval completes", () => {
    const { arrays, dispose } = lazyArrays(3);
    try {
      asyncEval(...arrays);
      for (const a of arrays) waitFor(a);
      expect(arrays.every((a) => isAvailable(a))).toBe(true);
      expect(arrays[1]!.tolist()).toEqual([1, 2, 3]);
    } finally {
      dispose();
    }
  });
});

describe("devices, streams, memory", () => {
  test("cpu is there; gpu is refused with a clear error when absent", () => {
    expect(mlxVersion()).toMatch(/^\d+\.\d+\.\d+/);
    expect(isDeviceAvailable("cpu")).toBe(true);
    expect(defaultDevice()).toBe(isDeviceAvailable("gpu") ? "gpu" : "cpu");
    if (!isDeviceAvailable("gpu")) {
      expect(() => setDefaultDevice("gpu")).toThrow(/gpu device is not available/);
      expect(defaultDevice()).toBe("cpu");
    }
    setDefaultDevice("cpu");
    expect(defaultDevice()).toBe("cpu");
  });

  test("streams: default and new, synchronize", () => {
    using d = Stream.default("cpu");
    using s = Stream.create("cpu");
    expect(d.device).toBe("cpu");
    expect(s.index).not.toBe(d.index);
    const { arrays, dispose } = lazyArrays(1);
    using viaStream = loadSafetensors(join(dir, "lazy-1.safetensors"), s);
    evaluate(...viaStream.tensors.values());
    s.synchronize();
    synchronize();
    dispose();
    expect(String(s)).toMatch(/^Stream\(cpu, \d+\)$/);
  });

  test("memory statistics and limits", () => {
    memory.resetPeak();
    const before = memory.active();
    using a = MlxArray.fromTypedArray(new Float32Array(1 << 18));
    expect(memory.active() - before).toBeGreaterThanOrEqual(1 << 20);
    expect(memory.peak()).toBeGreaterThanOrEqual(memory.active());
    const oldLimit = memory.setLimit(1 << 30);
    expect(memory.limit()).toBe(1 << 30);
    memory.setLimit(oldLimit);
    const oldCache = memory.setCacheLimit(0);
    memory.clearCache();
    expect(memory.cache()).toBe(0);
    memory.setCacheLimit(oldCache);
    expect(() => memory.setLimit(-1)).toThrow(/memory limit must be >= 0/);
  });
});
