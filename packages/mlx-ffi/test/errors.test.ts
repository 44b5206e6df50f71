import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { lib, loadSafetensors, MlxArray, MlxError, saveSafetensors, SafetensorsError, type Dtype } from "../src/index.ts";

const dir = mkdtempSync(join(tmpdir(), "mlxb-err-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function header(obj: unknown): Buffer {
  const json = Buffer.from(JSON.stringify(obj));
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(json.length));
  return Buffer.concat([len, json]);
}

describe("bad input is a JavaScript Error and the process keeps running", () => {
  test("invalid shape", () => {
    expect(() => MlxArray.fromNumbers([1, 2, 3], [2, 2])).toThrow(/3 values do not fit shape \[2, 2\]/);
    expect(() => MlxArray.fromTypedArray(new Float32Array(4), [-1, -4])).toThrow(/invalid shape \[-1, -4\]/);
    expect(() => MlxArray.fromTypedArray(new Float32Array(4), [2.5])).toThrow(MlxError);
    expect(() => MlxArray.fromTypedArray(new Float32Array(3), [2, 2])).toThrow(/12 bytes does not fit shape \[2, 2\] of float32/);
    // The native guard itself: a byte count that lies, and a negative ndim.
    const l = lib();
    expect(l.mlxb_array_from_bytes(new Float32Array(2), 8, new Int32Array([3]), 1, 10)).toBeNull();
    expect(String(l.mlxb_last_error())).toMatch(/buffer holds 8 bytes but shape and dtype need 12/);
    expect(l.mlxb_array_from_bytes(null, 0, null, -1, 10)).toBeNull();
    expect(String(l.mlxb_last_error())).toMatch(/negative ndim/);
  });

  test("unsupported dtype", () => {
    expect(() => MlxArray.fromNumbers([1], [1], "float8" as Dtype)).toThrow(/unsupported dtype "float8"/);
    const l = lib();
    expect(l.mlxb_array_scalar(1, 42)).toBeNull();
    expect(String(l.mlxb_last_error())).toMatch(/unsupported dtype code 42/);
  });

  test("use of a disposed array", () => {
    const a = MlxArray.fromNumbers([1, 2], [2]);
    a.dispose();
    a.dispose(); // twice is fine
    expect(a.disposed).toBe(true);
    expect(() => a.shape).toThrow(/MlxArray used after dispose\(\)/);
    expect(() => a.toTypedArray()).toThrow(/used after dispose/);
    expect(a.describe()).toBe("array(<disposed>)");
  });

  test("missing file", () => {
    expect(() => loadSafetensors(join(dir, "nope.safetensors"))).toThrow(/nope\.safetensors: file not found/);
  });

  test("truncated safetensors file", () => {
    const good = join(dir, "good.safetensors");
    using a = MlxArray.fromTypedArray(new Float32Array(64).fill(1), [8, 8]);
    saveSafetensors(good, { a });
    const bytes = readFileSync(good);
    const cut = join(dir, "cut.safetensors");
    writeFileSync(cut, bytes.subarray(0, bytes.length - 10));
    expect(() => loadSafetensors(cut)).toThrow(/tensor 'a': data_offsets end 256 is past the data section \(246 bytes\): file truncated/);
    writeFileSync(cut, bytes.subarray(0, 20));
    expect(() => loadSafetensors(cut)).toThrow(/header length \d+ exceeds the file \(20 bytes\)/);
    writeFileSync(cut, bytes.subarray(0, 4));
    expect(() => loadSafetensors(cut)).toThrow(/too short for a header/);
  });

  test("a header that lies about sizes", () => {
    const path = join(dir, "lie.safetensors");
    const data = Buffer.alloc(16);
    writeFileSync(path, Buffer.concat([header({ w: { dtype: "F32", shape: [4, 4], data_offsets: [0, 16] } }), data]));
    expect(() => loadSafetensors(path)).toThrow(SafetensorsError);
    expect(() => loadSafetensors(path)).toThrow(/tensor 'w': data_offsets \[0, 16\] hold 16 bytes but float32 \[4,4\] needs 64/);
    writeFileSync(path, Buffer.concat([header({ w: { dtype: "F32", shape: [4], data_offsets: [0, 16] } }), Buffer.alloc(8)]));
    expect(() => loadSafetensors(path)).toThrow(/past the data section/);
    writeFileSync(path, Buffer.concat([header({ w: { dtype: "Q9", shape: [1], data_offsets: [0, 1] } }), Buffer.alloc(1)]));
    expect(() => loadSafetensors(path)).toThrow(/tensor 'w': unsupported dtype "Q9"/);
    writeFileSync(path, Buffer.concat([Buffer.from([5, 0, 0, 0, 0, 0, 0, 0]), Buffer.from("{oops")]));
    expect(() => loadSafetensors(path)).toThrow(/header is not valid JSON/);
  });

  test("the process is still healthy after all of the above", () => {
    using a = MlxArray.fromNumbers([1, 2, 3], [3], "int32");
    expect(a.tolist()).toEqual([1, 2, 3]);
  });
});
