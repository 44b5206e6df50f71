import { execFileSync } from "node:child_process";
import { copyFileSync, readdirSync, readFileSync, statSync, truncateSync, utimesSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { type Cache, KVCache, QuantizeAfterKVCache } from "@mlx-bun/kv-cache";
import { liveMappings, mapSafetensors, memory, MlxArray, saveMappableSafetensors } from "@mlx-bun/mlx-ffi";
import { type KvMode, type LoadedModel, loadModel } from "@mlx-bun/models";
import { KV_STORE_VERSION, KvStoreError, loadPromptCache, readPromptCacheInfo, removeStaleTemps, savePromptCache, verifyPromptCache } from "../src/kv-store.ts";
import { exactDiff } from "../../../tools/oracle/compare.ts";
import { cacheDigest, disposeCaches, greedy, makeTiny, promptIds, tempDir } from "./kv-helpers.ts";

const tmp = tempDir("mlxb-kvstore-");
afterAll(() => tmp.cleanup());

// Sliding layers (head dim 32) need their own codec settings: affine group 32, TurboQuant none (64+ only).
const MODES: Record<string, { mode: KvMode; opts: { slidingMode?: KvMode } }> = {
  bf16: { mode: { kind: "bf16" }, opts: {} },
  q8: { mode: { kind: "affine", bits: 8, groupSize: 64 }, opts: { slidingMode: { kind: "affine", bits: 8, groupSize: 32 } } },
  turbo: { mode: { kind: "turbo", kBits: 4, vBits: 3 }, opts: { slidingMode: { kind: "bf16" } } },
};

const models = new Map<string, LoadedModel>();
let base = { active: 0, handles: 0 };
beforeAll(() => {
  for (const [name, args] of [
    ["small", ["--variant", "small"]],
    ["dense", ["--variant", "dense"]],
    ["small-seed1", ["--variant", "small", "--seed", "1"]],
  ] as const) {
    models.set(name, loadModel(makeTiny(join(tmp.dir, name), [...args])));
  }
  // Weights load lazily: run each model once so the baseline holds them.
  for (const lm of models.values()) {
    const c = lm.model.makeCaches();
    greedy(lm.model, c, promptIds(4), 2).dispose();
    disposeCaches(c);
  }
  base = { active: memory.active(), handles: memory.liveHandles() };
});
afterAll(() => {
  for (const lm of models.values()) lm.dispose();
});

const PROMPT = promptIds(24); // longer than the sliding window (8): rotating caches wrap
const STEPS = 10;
const SPLIT = 4; // save after this many generated tokens

// "after": mlx-lm's --kv-bits 8 --quantized-kv-start 10 (bf16 full-attention caches turn affine at 10 tokens).
const make = (lm: LoadedModel, kv: string) => (): Cache[] =>
  kv === "after"
    ? lm.model.makeCaches().map((c) => (c instanceof KVCache ? (c.dispose(), new QuantizeAfterKVCache(10, 8, 64)) : c))
    : lm.model.makeCaches(MODES[kv]!.mode, MODES[kv]!.opts);

describe("save → load → resume = uninterrupted (identical tokens, bit-identical logits)", () => {
  for (const name of ["small", "dense"]) {
    for (const kv of [...Object.keys(MODES), "after"]) {
      test(`${name}, ${kv}`, () => {
        const lm = models.get(name)!;
        const full = make(lm, kv)();
        const ref = greedy(lm.model, full, PROMPT, STEPS);
        disposeCaches(full, true);

        const first = make(lm, kv)();
        const head = greedy(lm.model, first, PROMPT, SPLIT);
        const file = join(tmp.dir, `${name}-${kv}.safetensors`);
        // The caches hold the prompt and all picked tokens but the last, which is stored as pending.
        const saved = savePromptCache(file, { fingerprint: lm.fingerprint, caches: first, tokens: [...PROMPT, ...head.tokens] });
        expect(saved.offset).toBe(PROMPT.length + SPLIT - 1);
        expect(saved.bytesPerToken).toBeGreaterThan(0);
        const signatures = first.map((c) => c.signature());
        disposeCaches(first, true);

        const info = readPromptCacheInfo(file);
        expect(info.formatVersion).toBe(KV_STORE_VERSION);
        expect(info.layers.map((l) => l.signature)).toEqual(signatures);
        expect(Date.parse(info.created)).toBeGreaterThan(0);

        const loaded = loadPromptCache(file, { fingerprint: lm.fingerprint, makeCaches: make(lm, kv) });
        expect(loaded.caches.length).toBe(lm.model.firstShared); // KV-sharing layers have no cache
        expect(loaded.tokens).toEqual([...PROMPT, ...head.tokens]);
        expect(loaded.mapped).toBe(loaded.tensors); // read in place (CPU backend)
        expect(liveMappings()).toBe(1);
        const tail = greedy(lm.model, loaded.caches, loaded.tokens!.slice(loaded.offset), STEPS - SPLIT);
        disposeCaches(loaded.caches, true);
        expect(liveMappings()).toBe(0);

        try {
          expect([...head.tokens, ...tail.tokens]).toEqual(ref.tokens);
          head.rows.forEach((r, i) => expect(exactDiff(r, ref.rows[i]!)).toBeNull());
          tail.rows.forEach((r, i) => expect(exactDiff(r, ref.rows[SPLIT + i]!)).toBeNull());
        } finally {
          ref.dispose();
          head.dispose();
          tail.dispose();
        }
        expect(memory.liveHandles()).toBe(base.handles);
        expect(memory.active()).toBe(base.active);
      });
    }
  }
});

describe("bad files: a clear error, the file intact, the caller's caches unchanged", () => {
  let good = "";
  let held: Cache[] = [];
  let heldDigest = "";
  beforeAll(() => {
    const lm = models.get("small")!;
    const c = make(lm, "bf16")();
    greedy(lm.model, c, PROMPT, 3).dispose();
    good = join(tmp.dir, "good.safetensors");
    savePromptCache(good, { fingerprint: lm.fingerprint, caches: c, tokens: [...PROMPT, 1, 2, 3].slice(0, c[0]!.offset) });
    disposeCaches(c);
    // The caller's live caches, which a failed load must leave alone.
    held = make(lm, "bf16")();
    greedy(lm.model, held, promptIds(12, 3), 2).dispose();
    heldDigest = cacheDigest(held);
  });
  afterAll(() => disposeCaches(held));

  const variant = (name: string, edit: (f: string) => void): string => {
    const f = join(tmp.dir, name);
    copyFileSync(good, f);
    edit(f);
    return f;
  };
  // The snapshot's tensors rewritten with other metadata (the header hash left as it was).
  const rewrite = (name: string, edit: (md: Record<string, string>) => Record<string, string>): string => {
    const f = join(tmp.dir, name);
    const pad = `${lmSmallLayers()}.pad.`;
    using m = mapSafetensors(good, { padPrefix: pad });
    saveMappableSafetensors(f, [...m.tensors], edit({ ...m.metadata }), { padPrefix: pad });
    return f;
  };
  const withMetadata = (name: string, patch: Record<string, string>): string => rewrite(name, (md) => ({ ...md, ...patch }));
  const without = (md: Record<string, string>, key: string): Record<string, string> => {
    expect(md[key]).toBeDefined();
    delete md[key];
    return md;
  };
  const fifo = (name: string): string => {
    const f = join(tmp.dir, name);
    execFileSync("mkfifo", [f]);
    return f;
  };
  const lmSmallLayers = (): number => models.get("small")!.model.firstShared;

  const cases: [string, () => { file: string; fingerprint?: string; kv?: string; model?: string }, RegExp][] = [
    ["another model (other architecture)", () => ({ file: good, model: "dense" }), /saved from another model \(fingerprint [0-9a-f]+\), this model is/],
    ["another model (same architecture, other weights)", () => ({ file: good, model: "small-seed1" }), /saved from another model/],
    [
      "another format version",
      () => ({ file: withMetadata("v3.safetensors", { "0.mlx_bun_format_version": "3" }) }),
      /format version 3, but this build reads version 2/,
    ],
    [
      "a version 1 file (an older mlx-bun)",
      () => ({ file: rewrite("v1.safetensors", () => ({ "mlx_bun.format": "mlx-bun/kv-store", "mlx_bun.format_version": "1" })) }),
      /format version 1 \(an older mlx-bun\), but this build reads version 2; save the snapshot again/,
    ],
    ["not a KV snapshot", () => ({ file: withMetadata("nota.safetensors", { "0.mlx_bun_format": "something-else" }) }), /not an mlx-bun KV snapshot/],
    [
      "a safetensors file that is no prompt cache",
      () => ({ file: rewrite("plain.safetensors", () => ({})) }),
      /not a prompt cache: neither an mlx-bun KV snapshot .* nor mlx-lm's save_prompt_cache format/,
    ],
    [
      "a dtype relabelled to another of the same size (BF16 -> F16)",
      () => ({
        file: variant("relabel.safetensors", (f) => {
          const b = readFileSync(f);
          const at = b.indexOf('"dtype":"BF16"');
          expect(at).toBeGreaterThan(0);
          b.write('"dtype":"F16" ', at, "latin1"); // same header length: JSON allows the space
          writeFileSync(f, b);
        }),
      }),
      /the header does not match its hash .*: corrupt or edited snapshot/,
    ],
    [
      "the token-hash field deleted",
      () => ({ file: rewrite("notokhash.safetensors", (md) => without(md, "0.mlx_bun_tokens_xxh3")) }),
      /the header does not match its hash/,
    ],
    [
      "the header hash deleted",
      () => ({ file: rewrite("nohash.safetensors", (md) => without(md, "0.mlx_bun_header_xxh3")) }),
      /metadata 0\.mlx_bun_header_xxh3 is missing: corrupt or edited snapshot/,
    ],
    ["a FIFO (refused without blocking)", () => ({ file: fifo("pipe.safetensors") }), /a FIFO, not a regular file/],
    [
      "truncated",
      () => ({ file: variant("trunc.safetensors", (f) => truncateSync(f, Math.floor(readFileSync(f).length / 2))) }),
      /not a readable snapshot: .*(truncated|past the data section)/,
    ],
    [
      "corrupt header",
      () => ({
        file: variant("hdr.safetensors", (f) => {
          const b = readFileSync(f);
          b.write("#corrupt#", 40, "latin1");
          writeFileSync(f, b);
        }),
      }),
      /not a readable snapshot: .*header is not valid JSON/,
    ],
    [
      "corrupt data",
      () => ({
        file: variant("data.safetensors", (f) => {
          const b = readFileSync(f);
          b[b.length - 3] = b[b.length - 3]! ^ 0xff; // inside the last cache tensor
          writeFileSync(f, b);
        }),
      }),
      /tensor '\d+\.(\d+(\.\d+)?' \(layer \d+\)|tokens') does not match its saved hash: corrupt data/,
    ],
    [
      "signature mismatch (another KV mode)",
      () => ({ file: good, kv: "q8" }),
      /cache signatures differ .*layer 0: file rotating:8:0:kv:plain, model rotating:8:0:kv:quant:8:32/,
    ],
    ["missing file", () => ({ file: join(tmp.dir, "nope.safetensors") }), /file not found/],
  ];
  for (const [what, setup, message] of cases) {
    test(what, () => {
      const { file, kv = "bf16", model = "small" } = setup();
      const lm = models.get(model)!;
      let before: Buffer | null = null;
      try {
        before = statSync(file).isFile() ? readFileSync(file) : null;
      } catch {
        before = null;
      }
      const handles = memory.liveHandles();
      let err: unknown;
      try {
        loadPromptCache(file, { fingerprint: lm.fingerprint, makeCaches: make(lm, kv) }).dispose();
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(KvStoreError);
      expect((err as Error).message).toContain(file);
      expect((err as Error).message).toMatch(message);
      if (before) expect(readFileSync(file).equals(before)).toBe(true);
      expect(cacheDigest(held)).toBe(heldDigest);
      expect(memory.liveHandles()).toBe(handles);
      expect(liveMappings()).toBe(0);
    });
  }

  test("a failed save leaves the existing file intact and no temporary file", () => {
    const lm = models.get("small")!;
    const before = readFileSync(good);
    const broken = {
      ...held[0]!,
      offset: held[0]!.offset,
      state: () => {
        throw new Error("boom");
      },
    } as unknown as Cache;
    expect(() => savePromptCache(good, { fingerprint: lm.fingerprint, caches: [broken], tokens: promptIds(held[0]!.offset) })).toThrow(/boom/);
    const disposed = MlxArray.fromNumbers([1], [1], "int32");
    disposed.dispose();
    const badState = {
      offset: 1,
      minimumReusableOffset: 0,
      state: () => ({ signature: "kv:plain", tensors: [disposed], meta: { offset: 1 }, [Symbol.dispose]() {} }),
    } as unknown as Cache;
    expect(() => savePromptCache(good, { fingerprint: lm.fingerprint, caches: [badState], tokens: [5] })).toThrow();
    expect(readFileSync(good).equals(before)).toBe(true);
    expect(readdirSync(tmp.dir).filter((f) => f.endsWith(".tmp"))).toEqual([]);
    expect(() => savePromptCache(good, { fingerprint: lm.fingerprint, caches: held, tokens: [1] })).toThrow(KvStoreError);
  });
});

describe("the file is mlx-lm's save_prompt_cache layout", () => {
  test("classes, scalars and state tensors as mlx-lm names them; our extras under index L; verify passes", () => {
    const lm = models.get("small")!;
    const c = make(lm, "after")();
    greedy(lm.model, c, PROMPT, 2).dispose();
    const file = join(tmp.dir, "layout.safetensors");
    const saved = savePromptCache(file, { fingerprint: lm.fingerprint, caches: c, tokens: [...PROMPT, 7], model: lm.dir });
    expect(saved.mlxLmReadable).toBe(true);
    disposeCaches(c);
    using m = mapSafetensors(file, { padPrefix: "4.pad." });
    const md = m.metadata;
    // small: layers 0, 1, 3 sliding (window 8), 2 full (quantized after 10 tokens: 25 are held).
    expect([0, 1, 2, 3].map((i) => md[`1.${i}`])).toEqual(["RotatingKVCache", "RotatingKVCache", "QuantizedKVCache", "RotatingKVCache"]);
    expect(md["0.model"]).toBe(lm.dir);
    expect(JSON.parse(md["0.tokenizer_config"]!)).toEqual({ trust_remote_code: false });
    expect(md["2.0"]).toBe("");
    const scalars = new Map<string, string>();
    for (let k = 1; md[`2.${k}.0`] !== undefined; k++) scalars.set(md[`2.${k}.0`]!, md[`2.${k}.1`]!);
    expect(scalars.get("0.2")).toBe("scalar"); // offset
    expect(scalars.get("0.5")).toBe("scalar"); // _idx
    expect(scalars.get("2.4")).toBe("scalar"); // bits
    expect(m.tensors.get("2.4")!.item()).toBe(8);
    expect(m.tensors.get("2.3")!.item()).toBe(64);
    expect(m.tensors.get("2.2")!.item()).toBe(PROMPT.length + 1);
    expect(m.tensors.get("2.0.0")!.dtype).toBe("uint32"); // quantized keys (w, scales, biases)
    expect(m.tensors.get("0.4")!.item()).toBe(8); // max_size
    expect(m.tensors.get("4.tokens")!.tolist()).toEqual([...PROMPT, 7]);
    const v = verifyPromptCache(file);
    expect(v.info.format).toBe("mlx-bun");
    expect(v.checks.join("\n")).toMatch(/header hash matches/);
    expect(v.checks.join("\n")).toMatch(/data: \d+ cache tensors and the 25 token ids match/);
  });

  test("a save removes the temporary files killed saves left (not a live writer's)", () => {
    const lm = models.get("small")!;
    const c = make(lm, "bf16")();
    greedy(lm.model, c, promptIds(5), 1).dispose();
    const file = join(tmp.dir, "temps.safetensors");
    const dead = join(tmp.dir, ".temps.safetensors.999999999.1700000000000.abc123.tmp");
    const live = join(tmp.dir, `.temps.safetensors.${process.ppid}.1700000000000.def456.tmp`);
    const other = join(tmp.dir, ".other.safetensors.999999999.1700000000000.abc123.tmp");
    for (const f of [dead, live, other]) writeFileSync(f, "half-written");
    const saved = savePromptCache(file, { fingerprint: lm.fingerprint, caches: c, tokens: promptIds(5) });
    disposeCaches(c);
    expect(saved.removedTemps).toEqual([dead]);
    expect(readdirSync(tmp.dir)).toEqual(
      expect.arrayContaining([".other.safetensors.999999999.1700000000000.abc123.tmp", `.temps.safetensors.${process.ppid}.1700000000000.def456.tmp`]),
    );
    expect(readdirSync(tmp.dir)).not.toContain(".temps.safetensors.999999999.1700000000000.abc123.tmp");
  });

  test.runIf(process.platform === "linux")("a temporary file whose pid now belongs to a process started after its last write is stale (pid reuse)", () => {
    // The parent process is alive and started minutes ago at most: it cannot have written a file last modified in 2001.
    const reused = join(tmp.dir, `.reused.safetensors.${process.ppid}.1000000000000.aaa111.tmp`);
    const live = join(tmp.dir, `.reused.safetensors.${process.ppid}.1700000000000.bbb222.tmp`);
    for (const f of [reused, live]) writeFileSync(f, "half-written");
    utimesSync(reused, new Date(1_000_000_000_000), new Date(1_000_000_000_000));
    expect(removeStaleTemps(join(tmp.dir, "reused.safetensors"))).toEqual([reused]);
    expect(readdirSync(tmp.dir)).toContain(`.reused.safetensors.${process.ppid}.1700000000000.bbb222.tmp`);
  });
});

test("the fingerprint tells same-architecture checkpoints with different weights apart", () => {
  const a = models.get("small")!;
  const b = models.get("small-seed1")!;
  expect(a.config.raw).toEqual(b.config.raw);
  expect(a.fingerprint).not.toBe(b.fingerprint);
  // …and is stable for the same files.
  using again = loadModel(a.dir);
  expect(again.fingerprint).toBe(a.fingerprint);
});
