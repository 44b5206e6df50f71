import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { DTYPES, MlxArray, loadSafetensors, readSafetensorsHeader, saveSafetensors } from "../src/index.ts";
import { sample } from "./samples.ts";
import { runPython } from "../../../tools/oracle/oracle.ts";
import { exactDiff } from "../../../tools/oracle/compare.ts";

const dir = mkdtempSync(join(tmpdir(), "mlxb-st-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const PY_DIGEST = `
import sys, json, hashlib, mlx.core as mx
arrs, meta = mx.load(sys.argv[1], return_metadata=True)
out = {}
for k, v in arrs.items():
    shape = list(v.shape)
    v = v.reshape(-1)
    b = bytes(memoryview(v.view(mx.uint8) if v.dtype != mx.bool_ else v.astype(mx.uint8)))
    out[k] = [str(v.dtype).replace("mlx.core.", ""), shape, hashlib.sha256(b).hexdigest()]
print(json.dumps({"arrays": out, "meta": meta}))
`;

const PY_WRITE = `
import sys, mlx.core as mx
k = mx.random.key(7)
arrs = {
  "f32": mx.random.normal((3, 5), key=k),
  "bf16": mx.random.normal((4, 4), key=k).astype(mx.bfloat16),
  "f16": mx.random.uniform(shape=(2, 3), key=k).astype(mx.float16),
  "i8": mx.array([[-128, 0, 127]], dtype=mx.int8),
  "u32": mx.arange(10, dtype=mx.uint32),
  "i64": mx.array([-(2**62), 2**62], dtype=mx.int64),
  "b": mx.array([True, False, True]),
  "c64": mx.array([1+2j, -3.5j]),
  "scalar": mx.array(3.25),
}
mx.save_safetensors(sys.argv[1], arrs, metadata={"format": "mlx", "note": "from python"})
import numpy as np
np.savez(sys.argv[2], **{k: np.array(v.astype(mx.float32) if v.dtype == mx.bfloat16 else v) for k, v in arrs.items()})
`;

function sha256(bytes: Uint8Array): string {
  return new Bun.CryptoHasher("sha256").update(bytes).digest("hex");
}

describe("safetensors interop with Python MLX", () => {
  test("files we save load in Python MLX with identical contents and metadata", () => {
    const path = join(dir, "ours.safetensors");
    // MLX's safetensors writer has no float64 (its own limitation; see the next test).
    const arrays = new Map(DTYPES.filter((d) => d !== "float64").map((dt) => [`t_${dt}`, sample(dt, 12)]));
    saveSafetensors(path, arrays, { format: "mlx", who: "mlx-bun" });
    const py = JSON.parse(runPython(["-c", PY_DIGEST, path])) as {
      arrays: Record<string, [string, number[], string]>;
      meta: Record<string, string>;
    };
    expect(py.meta).toEqual({ format: "mlx", who: "mlx-bun" });
    expect(Object.keys(py.arrays).sort()).toEqual([...arrays.keys()].sort());
    for (const [name, a] of arrays) {
      const [dtype, shape, digest] = py.arrays[name]!;
      expect(dtype, name).toBe(a.dtype);
      expect(shape).toEqual([...a.shape]);
      expect(digest, name).toBe(sha256(new Uint8Array(a.toTypedArray().buffer)));
      a.dispose();
    }
  });

  test("files Python MLX saves load in ours with identical contents", () => {
    const path = join(dir, "theirs.safetensors");
    runPython(["-c", PY_WRITE, path, join(dir, "theirs.npz")]);
    using loaded = loadSafetensors(path);
    expect(loaded.metadata).toEqual({ format: "mlx", note: "from python" });
    expect([...loaded.tensors.keys()].sort()).toEqual(["b", "bf16", "c64", "f16", "f32", "i64", "i8", "scalar", "u32"]);
    // Digest each tensor in Python and compare with ours.
    const py = JSON.parse(runPython(["-c", PY_DIGEST, path])) as { arrays: Record<string, [string, number[], string]> };
    for (const [name, a] of loaded.tensors) {
      const [dtype, shape, digest] = py.arrays[name]!;
      expect(a.dtype, name).toBe(dtype);
      expect([...a.shape]).toEqual(shape);
      expect(sha256(new Uint8Array(a.toTypedArray().buffer)), name).toBe(digest);
    }
    expect(loaded.tensors.get("i64")!.tolist()).toEqual([-(2n ** 62n), 2n ** 62n]); // beyond 2^53: bigint
    expect(loaded.tensors.get("b")!.tolist()).toEqual([true, false, true]);
    expect(loaded.tensors.get("scalar")!.item()).toBe(3.25);
  });

  test("save round-trips in ours, header readable without loading data", () => {
    const path = join(dir, "rt.safetensors");
    using a = sample("bfloat16", 6);
    saveSafetensors(path, { a }, { k: "v" });
    const h = readSafetensorsHeader(path);
    expect(h.tensors.get("a")).toEqual({ dtype: "bfloat16", shape: [6], dataOffsets: [0, 12] });
    using back = loadSafetensors(path);
    expect(exactDiff(back.tensors.get("a")!, a)).toBeNull();
  });

  test("writes are atomic: a failed save leaves the old file intact and no temp file", () => {
    const path = join(dir, "atomic.safetensors");
    using a = sample("float32", 4);
    saveSafetensors(path, { a });
    const before = readFileSync(path);
    const gone = sample("float32", 4);
    gone.dispose();
    expect(() => saveSafetensors(path, { a, gone })).toThrow(/used after dispose/);
    expect(readFileSync(path).equals(before)).toBe(true);
    expect(readdirSync(dir).filter((f) => f.includes(".tmp"))).toEqual([]);
    expect(() => saveSafetensors(join(dir, "no-such-dir", "x.safetensors"), { a })).toThrow();
    expect(existsSync(join(dir, "no-such-dir"))).toBe(false);
    using f64 = sample("float64", 2);
    expect(() => saveSafetensors(path, { f64 })).toThrow(/save_safetensors\(.*atomic\.safetensors\): \[save_safetensors\] received invalid dtype/);
    expect(readFileSync(path).equals(before)).toBe(true);
    expect(readdirSync(dir).filter((f) => f.includes(".tmp"))).toEqual([]);
    writeFileSync(join(dir, "unrelated"), "x");
  });
});
