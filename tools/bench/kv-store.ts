// KV store: restoring a saved prompt cache (mapped from disk) against re-running the prompt.
// For each context length and KV mode: prefill time (chunked, as the engine does), save time and
// file size (bytes per token), restore time (loadPromptCache with and without hash verification),
// and time to the first new token's logits both ways. Medians over --reps runs with a warm page
// cache (the file was just written or read); a cold read adds the disk's read time for the file.
//
//   .native/bin/bun tools/bench/kv-store.ts [--model DIR | --variant dense|small] [--contexts 2048,4096]
//       [--kv bf16/q8/turbo:4,3] [--reps 3] [--chunk 512]
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Cache } from "@mlx-bun/kv-cache";
import { evaluate, MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { type KvMode, loadModel, parseKvMode } from "@mlx-bun/models";
import { loadPromptCache, savePromptCache } from "../../packages/runtime/src/kv-store.ts";
import { runPython } from "../oracle/oracle.ts";
import { median } from "./stats.ts";

const argv = process.argv;
const opt = (name: string, def: string): string => {
  const i = argv.indexOf(`--${name}`);
  return i >= 0 ? argv[i + 1]! : def;
};
const REPS = Number(opt("reps", "3"));
const CONTEXTS = opt("contexts", "2048,4096").split(",").map(Number);
const KVS = opt("kv", "bf16").split("/");
const CHUNK = Number(opt("chunk", "512"));

const work = mkdtempSync(join(tmpdir(), "mlxb-bench-kvstore-"));
let dir = opt("model", "");
if (!dir) {
  dir = join(work, "model");
  runPython([join(import.meta.dir, "..", "make-tiny-model", "make_tiny_model.py"), "--variant", opt("variant", "dense"), "--out", dir]);
}
const lm = loadModel(dir);
const model = lm.model;
// Sliding layers of the tiny models have head dim 32: quantize only full-attention layers there.
const modeOf = (kv: string): { mode: KvMode; opts: { slidingMode?: KvMode } } => ({
  mode: parseKvMode(kv),
  opts: kv === "bf16" ? {} : { slidingMode: { kind: "bf16" } },
});

const ms = (t0: number): number => performance.now() - t0;

function evalCaches(caches: Cache[]): void {
  const arrays: MlxArray[] = [];
  for (const c of caches) {
    using s = c.state();
    evaluate(...s.tensors);
    arrays.push(...s.tensors.map((t) => t.retain()));
  }
  for (const a of arrays) a.dispose();
}

/** Feed ids in chunks; returns the last logits row (evaluated) and leaves the caches evaluated. */
function feed(caches: Cache[], ids: number[]): MlxArray {
  let logits: MlxArray | undefined;
  for (let s = 0; s < ids.length; s += CHUNK) {
    logits?.dispose();
    const part = ids.slice(s, s + CHUNK);
    using x = MlxArray.fromNumbers(part, [1, part.length], "int32");
    logits = model.forward(x, caches).eval();
  }
  const row = mx.index(logits!, 0, -1).eval();
  logits!.dispose();
  return row;
}

const disposeAll = (caches: Cache[]): void => caches.forEach((c) => c.dispose());

interface Result {
  kv: string;
  context: number;
  prefillMs: number;
  saveMs: number;
  fileBytes: number;
  bytesPerToken: number;
  restoreMs: number;
  restoreNoVerifyMs: number;
  firstTokenColdMs: number;
  firstTokenRestoredMs: number;
  mapped: string;
}

console.log(`model ${dir} (${lm.config.text.numHiddenLayers} layers, fingerprint ${lm.fingerprint}), reps ${REPS}, prefill chunk ${CHUNK}`);
// Warm up: weights load lazily.
{
  const c = model.makeCaches();
  feed(c, [5, 6, 7, 8]).dispose();
  disposeAll(c);
}
const results: Result[] = [];
for (const kv of KVS) {
  const { mode, opts } = modeOf(kv);
  const make = (): Cache[] => model.makeCaches(mode, opts);
  for (const n of CONTEXTS) {
    const prompt = Array.from({ length: n }, (_, i) => 5 + ((i * 37) % 200));
    const file = join(work, `${kv.replace(/[^a-z0-9]/gi, "_")}-${n}.safetensors`);
    const t = {
      prefill: [] as number[],
      save: [] as number[],
      restore: [] as number[],
      restoreNv: [] as number[],
      coldFirst: [] as number[],
      warmFirst: [] as number[],
    };
    let fileBytes = 0;
    let bpt = 0;
    let mapped = "";
    for (let r = 0; r < REPS; r++) {
      // Cold: prefill the prompt, then the first new token's logits.
      let t0 = performance.now();
      const caches = make();
      feed(caches, prompt.slice(0, n - 1)).dispose();
      evalCaches(caches);
      t.prefill.push(ms(t0));
      const row = feed(caches, [prompt[n - 1]!]);
      t.coldFirst.push(ms(t0));
      row.dispose();
      disposeAll(caches);

      // Snapshot of the prompt minus its last token (what a prompt cache reuses).
      const snap = make();
      feed(snap, prompt.slice(0, n - 1)).dispose();
      t0 = performance.now();
      const info = savePromptCache(file, { fingerprint: lm.fingerprint, caches: snap, tokens: prompt });
      t.save.push(ms(t0));
      disposeAll(snap);
      fileBytes = info.bytes;
      bpt = info.bytesPerToken;

      t0 = performance.now();
      const nv = loadPromptCache(file, { fingerprint: lm.fingerprint, makeCaches: make, verify: false });
      t.restoreNv.push(ms(t0));
      nv.dispose();

      t0 = performance.now();
      const loaded = loadPromptCache(file, { fingerprint: lm.fingerprint, makeCaches: make });
      t.restore.push(ms(t0));
      const first = feed(loaded.caches, loaded.tokens!.slice(loaded.offset));
      t.warmFirst.push(ms(t0));
      mapped = `${loaded.mapped}/${loaded.tensors}`;
      first.dispose();
      loaded.dispose();
    }
    const res: Result = {
      kv,
      context: n,
      prefillMs: median(t.prefill),
      saveMs: median(t.save),
      fileBytes,
      bytesPerToken: bpt,
      restoreMs: median(t.restore),
      restoreNoVerifyMs: median(t.restoreNv),
      firstTokenColdMs: median(t.coldFirst),
      firstTokenRestoredMs: median(t.warmFirst),
      mapped,
    };
    results.push(res);
    console.log(
      `${kv.padEnd(9)} ctx ${String(n).padStart(5)}: prefill ${res.prefillMs.toFixed(1)} ms | save ${res.saveMs.toFixed(1)} ms, ` +
        `${(fileBytes / 1024).toFixed(0)} KiB (${bpt.toFixed(0)} B/token) | restore ${res.restoreMs.toFixed(2)} ms ` +
        `(no verify ${res.restoreNoVerifyMs.toFixed(2)} ms), mapped ${mapped} | first token: cold ${res.firstTokenColdMs.toFixed(1)} ms, ` +
        `restored ${res.firstTokenRestoredMs.toFixed(1)} ms (${(res.firstTokenColdMs / res.firstTokenRestoredMs).toFixed(1)}x)`,
    );
  }
}
lm.dispose();
rmSync(work, { recursive: true, force: true });
if (opt("json", "")) await Bun.write(opt("json", ""), JSON.stringify(results, null, 2));
