// --kv / --kv-sliding into EngineOptions, and the KV modes a prompt-cache file of ours asks for: a
// quantized --kv leaves the sliding layers bf16 (the Engine's default), so a file whose sliding
// layers are quantized (--kv-sliding, or one saved before that default) names its sliding mode.
import { describe, expect, test } from "vitest";
import type { KvStoreInfo } from "@mlx-bun/runtime";
import { kvForCacheFile } from "../src/commands/prompt-cache-file.ts";
import { engineOptions } from "../src/load.ts";
import type { ModelOptions } from "../src/options.ts";

const info = (signatures: string[]): KvStoreInfo =>
  ({
    path: "f",
    format: "mlx-bun",
    layers: signatures.map((signature) => ({ class: `mlx_bun:${signature}`, signature, meta: {}, minimumReusableOffset: 0, tensors: [] })),
  }) as unknown as KvStoreInfo;

const o = (extra: Partial<ModelOptions> = {}): ModelOptions => ({ prefillStepSize: 2048, ...extra });
const turbo = { kind: "turbo", kBits: 4, vBits: 3 } as const;

describe("--kv-sliding and prompt-cache files", () => {
  test("engineOptions: kvSliding only when given (flag, else the file's)", () => {
    expect(engineOptions(o({ kv: "turbo:4,3" })).kvSliding).toBeUndefined();
    expect(engineOptions(o({ kv: "turbo:4,3", kvSliding: "turbo:4,3" })).kvSliding).toBe("turbo:4,3");
    expect(engineOptions(o(), { kv: turbo, kvSliding: turbo })).toMatchObject({ kv: turbo, kvSliding: turbo });
    expect(engineOptions(o({ kvSliding: "bf16" }), { kv: turbo, kvSliding: turbo })).toMatchObject({ kv: turbo, kvSliding: "bf16" });
    expect(() => engineOptions(o({ kvSliding: "q8", kvBits: 8 }))).toThrow(/--kv-sliding does not combine with --kv-bits/);
  });

  test("kvForCacheFile: the full layers' mode, and the sliding layers' when they are quantized", () => {
    // The default layout: quantized full layers, bf16 sliding windows.
    expect(kvForCacheFile(info(["rotating:8:0:kv:plain", "kv:turboquant:4:3"]), o())).toEqual({ kv: turbo });
    // Every layer quantized: the sliding mode too (unless --kv-sliding is given).
    expect(kvForCacheFile(info(["rotating:8:0:kv:turboquant:4:3", "kv:turboquant:4:3"]), o())).toEqual({ kv: turbo, kvSliding: turbo });
    expect(kvForCacheFile(info(["rotating:8:0:kv:turboquant:4:3", "kv:turboquant:4:3"]), o({ kvSliding: "bf16" }))).toEqual({ kv: turbo });
    // bf16 full layers with q8 (group 32) sliding windows.
    expect(kvForCacheFile(info(["rotating:8:0:kv:quant:8:32", "kv:plain"]), o())).toEqual({ kvSliding: { kind: "affine", bits: 8, groupSize: 32 } });
    expect(kvForCacheFile(info(["rotating:8:0:kv:plain", "kv:plain"]), o())).toEqual({});
  });
});
