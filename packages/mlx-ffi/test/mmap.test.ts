import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, expect, test } from "vitest";
import {
  DTYPES,
  liveMappings,
  loadSafetensors,
  MappedFile,
  mapSafetensors,
  memory,
  MlxArray,
  readSafetensorsHeader,
  saveMappableSafetensors,
} from "../src/index.ts";
import { runPython } from "../../../tools/oracle/oracle.ts";
import { sample } from "./samples.ts";
import { exactDiff } from "../../../tools/oracle/compare.ts";

const dir = mkdtempSync(join(tmpdir(), "mlxb-mmap-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

test("a mappable file round-trips every dtype in place, aligned, readable by MLX and Python", () => {
  const active = memory.active();
  const handles = memory.liveHandles();
  const src = new Map(DTYPES.map((dt, i) => [`t.${dt}`, sample(dt, 37 + i)] as [string, MlxArray]));
  const f64 = src.get("t.float64")!;
  src.set(
    "big",
    MlxArray.fromNumbers(
      Array.from({ length: 300_000 }, (_, i) => i % 251),
      [600, 500],
      "float32",
    ),
  );
  const f = join(dir, "all.safetensors");
  const info = saveMappableSafetensors(f, src, { note: "hi" });
  expect(readFileSync(f).length).toBe(info.bytes);
  expect(readdirSync(dir).filter((n) => n.endsWith(".tmp"))).toEqual([]);

  const h = readSafetensorsHeader(f);
  for (const [name, t] of h.tensors) {
    if (name.startsWith("__pad.")) continue;
    const at = h.dataStart + t.dataOffsets[0];
    expect(at % (name === "big" ? 16384 : 64)).toBe(0);
  }
  const base = memory.active();
  {
    using m = mapSafetensors(f);
    expect(m.metadata).toEqual({ note: "hi" });
    expect([...m.tensors.keys()].sort()).toEqual([...src.keys()].sort());
    expect(m.mapped.size).toBe(m.tensors.size); // CPU backend: every tensor in place
    expect(memory.active()).toBe(base); // mapped bytes are not MLX allocations
    expect(liveMappings()).toBe(1);
    for (const [name, a] of src) expect(exactDiff(m.tensors.get(name)!, a)).toBeNull();
  }
  expect(liveMappings()).toBe(0);
  // MLX's own reader (and Python's) open the layout too; MLX reads no float64.
  const g = join(dir, "mlx.safetensors");
  src.delete("t.float64");
  f64.dispose();
  saveMappableSafetensors(
    g,
    [...src].filter(([n]) => n !== "t.float64"),
  );
  {
    using l = loadSafetensors(g);
    for (const [name, a] of src) expect(exactDiff(l.tensors.get(name)!, a)).toBeNull();
  }
  const py = JSON.parse(
    runPython([
      "-c",
      `import json, mlx.core as mx; d = mx.load(${JSON.stringify(g)}); print(json.dumps([sorted(k for k in d if not k.startswith("__pad.")), d["big"].astype(mx.int32).sum().item()]))`,
    ]),
  ) as [string[], number];
  expect(py[0]).toEqual([...src.keys()].sort());
  expect(py[1]).toBe(Array.from({ length: 300_000 }, (_, i) => i % 251).reduce((a, b) => a + b, 0));
  for (const a of src.values()) a.dispose();
  expect(memory.liveHandles()).toBe(handles);
  expect(memory.active()).toBe(active);
});

test("MappedFile: a range without the size prefix is copied, bounds are checked, the mapping outlives close()", () => {
  const f = join(dir, "raw.safetensors");
  using x = MlxArray.fromNumbers([1, 2, 3, 4, 5, 6, 7, 8], [8], "int32");
  saveMappableSafetensors(f, [["x", x]]);
  const at = readSafetensorsHeader(f).dataStart + readSafetensorsHeader(f).tensors.get("x")!.dataOffsets[0];
  const m = MappedFile.open(f);
  using inPlace = m.array(at, [8], "int32");
  using shifted = m.array(at + 4, [4], "int32"); // no size header before it: copied
  expect(m.isMapped(inPlace)).toBe(true);
  expect(m.isMapped(shifted)).toBe(false);
  expect(shifted.tolist()).toEqual([2, 3, 4, 5]);
  expect(() => m.array(m.size - 4, [2], "int32")).toThrow(/past the end of the mapping/);
  m.close();
  expect(() => m.array(at, [1], "int32")).toThrow(/used after close/);
  expect(liveMappings()).toBe(1); // inPlace still holds it
  expect(inPlace.tolist()).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
  inPlace.dispose();
  expect(liveMappings()).toBe(0);
  expect(() => MappedFile.open(join(dir, "missing"))).toThrow(/No such file/);
});
