// kv-store: persist a prompt cache (a model's per-layer caches plus the token ids they hold) as one
// safetensors file that mlx-lm's load_prompt_cache reads too, and restore it (ours or one written
// by mlx-lm's save_prompt_cache) by mapping the file instead of re-running the prompt.
import { toArrayBuffer } from "bun:ffi";
import { readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import { type Cache, type CacheMeta, KVCache, makeState, QuantizeAfterKVCache, RotatingKVCache } from "@mlx-bun/kv-cache";
import * as mx from "@mlx-bun/mlx-ops";
import {
  checkHandle,
  type Dtype,
  evaluate,
  lib,
  mapSafetensors,
  MlxArray,
  mlxVersion,
  readSafetensorsHeader,
  saveMappableSafetensors,
  type SafetensorsHeader,
} from "@mlx-bun/mlx-ffi";

/** Written into every snapshot of ours; a file without it is mlx-lm's, or not a prompt cache. */
export const KV_STORE_FORMAT = "mlx-bun/kv-store";
/**
 * Bumped when the layout or the metadata changes incompatibly; other versions are refused.
 * 1: own layout (`cache.<layer>.<slot>`); 2: mlx-lm's save_prompt_cache layout plus our extras.
 */
export const KV_STORE_VERSION = 2;

/**
 * Metadata keys. mlx-lm's save_prompt_cache flattens [metadata, classes, scalars] with tree_flatten:
 * `0.<key>` is its metadata dict (mlx_lm.generate reads `model` and `tokenizer_config`), `1.<i>`
 * the cache class of layer i, `2.0` = "" and `2.<k>.0` / `2.<k>.1` a (tensor name, "scalar" |
 * "string" | "none") pair. Ours live in the metadata dict as flat `mlx_bun_*` keys.
 */
const MD = {
  model: "0.model",
  tokenizerConfig: "0.tokenizer_config",
  format: "0.mlx_bun_format",
  version: "0.mlx_bun_format_version",
  fingerprint: "0.mlx_bun_model_fingerprint",
  created: "0.mlx_bun_created",
  offset: "0.mlx_bun_offset",
  tokenCount: "0.mlx_bun_token_count",
  layers: "0.mlx_bun_layers",
  mlx: "0.mlx_bun_mlx_version",
  tokensHash: "0.mlx_bun_tokens_xxh3",
  headerHash: "0.mlx_bun_header_xxh3",
} as const;
/** The key version 1 files carried. */
const V1_FORMAT_KEY = "mlx_bun.format";

/**
 * Our extra tensors sit under index L (the layer count): `L.tokens` (int32 [N]) and the layout's
 * padding (`L.pad.<i>`). mlx-lm's load_prompt_cache pairs classes with the tensor tree by zip, so
 * it never looks at index L.
 */
export const tokensTensor = (layers: number): string => `${layers}.tokens`;
const padPrefix = (layers: number): string => `${layers}.pad.`;

/** mlx-lm's cache classes this format maps to ours. */
export type MlxLmCacheClass = "KVCache" | "RotatingKVCache" | "QuantizedKVCache";
const MLX_LM_CLASSES: readonly string[] = ["KVCache", "RotatingKVCache", "QuantizedKVCache"];
/** Class name written for a cache mlx-lm has no class for (TurboQuant, quantized rotating): ours only. */
const OWN_CLASS_PREFIX = "mlx_bun:";

/** A snapshot that cannot be written or read: names the file and what is wrong. */
export class KvStoreError extends Error {
  override name = "KvStoreError";
  constructor(
    readonly path: string,
    what: string,
    options?: ErrorOptions,
  ) {
    super(`kv-store ${path}: ${what}`, options);
  }
}

/** One tensor of a layer, as the file's metadata records it. */
export interface KvStoreTensor {
  /** Its name in the file. */
  name: string;
  dtype: Dtype;
  shape: number[];
  /** xxHash3 (64-bit, hex) of its bytes (our files; mlx-lm writes none). */
  xxh3?: string;
}

/** One layer's entry. */
export interface KvStoreLayer {
  /** mlx-lm's class name (KVCache, RotatingKVCache, QuantizedKVCache), or `mlx_bun:<signature>`. */
  class: string;
  /** Our cache signature (null in a file mlx-lm wrote). */
  signature: string | null;
  /** Our CacheState.meta (ours), or mlx-lm's scalars: offset, keep, maxSize, idx, groupSize, bits. */
  meta: CacheMeta;
  minimumReusableOffset: number;
  /** The state tensors in CacheState slot order (none for an empty cache). */
  tensors: KvStoreTensor[];
}

/** What a snapshot file says about itself (header only; no tensor data read). */
export interface KvStoreInfo {
  path: string;
  /** "mlx-bun": ours (fingerprint, token ids, hashes); "mlx-lm": written by mlx-lm's save_prompt_cache. */
  format: "mlx-bun" | "mlx-lm";
  /** KV_STORE_VERSION for ours, 0 for mlx-lm's. */
  formatVersion: number;
  /** The model fingerprint (ours only). */
  fingerprint: string | null;
  /** mlx-lm's metadata "model" (the --model given when it was written), if any. */
  model: string | null;
  /** mlx-lm's metadata "tokenizer_config" (JSON), if any. */
  tokenizerConfig: Record<string, unknown> | null;
  /** ISO 8601 creation time (ours). */
  created: string;
  /** Tokens every cache holds. */
  offset: number;
  /** Token ids stored (ours: >= offset, the ones past it were never fed); null in mlx-lm's files. */
  tokenCount: number | null;
  layers: KvStoreLayer[];
  /** File size in bytes. */
  bytes: number;
  /** The MLX version that wrote the file (ours, informational). */
  mlxVersion: string;
}

export interface SavePromptCacheInput {
  /** LoadedModel.fingerprint of the model the caches belong to. */
  fingerprint: string;
  /** The model's caches (as `model.makeCaches` made them, one per layer that owns K/V). */
  caches: readonly Cache[];
  /**
   * The token ids the caches hold, in order; may run past the caches' offset by tokens not fed
   * yet (e.g. the last sampled token), which are stored and handed back on load.
   */
  tokens: readonly number[];
  /** mlx-lm's metadata "model": what mlx_lm.generate must be given as --model (default ""). */
  model?: string;
  /** mlx-lm's metadata "tokenizer_config" (default {"trust_remote_code": false}). */
  tokenizerConfig?: Record<string, unknown>;
}

export interface SavePromptCacheInfo {
  path: string;
  /** File size. */
  bytes: number;
  /** Bytes of cache tensors (padding, scalars and token ids excluded). */
  cacheBytes: number;
  offset: number;
  /** cacheBytes / offset (0 for an empty cache). */
  bytesPerToken: number;
  /** Whether mlx-lm's load_prompt_cache can read it (every layer has an mlx-lm class). */
  mlxLmReadable: boolean;
  /** Stale temporary files of interrupted saves removed before this one. */
  removedTemps: string[];
}

function hashBytes(a: MlxArray): string {
  if (a.nbytes === 0) return Bun.hash.xxHash3(new Uint8Array(0)).toString(16);
  const l = lib();
  const view = checkHandle(l.mlxb_array_host_view(a.handle), "kv-store hash", () => a.describe());
  try {
    const p = checkHandle(l.mlxb_array_data_ptr(view), "kv-store hash", () => a.describe());
    return Bun.hash.xxHash3(new Uint8Array(toArrayBuffer(p, 0, a.nbytes))).toString(16);
  } finally {
    l.mlxb_array_free(view);
  }
}

/** The offset every cache shares; throws if they differ. */
function commonOffset(path: string, caches: readonly Cache[]): number {
  const offsets = new Set(caches.map((c) => c.offset));
  if (offsets.size > 1) throw new KvStoreError(path, `caches hold different token counts (${[...offsets].join(", ")}); a snapshot needs one offset`);
  return caches[0]?.offset ?? 0;
}

/**
 * The hash over the header: every metadata entry but the hash itself and every tensor's name,
 * dtype and shape (padding excluded), canonically ordered. The per-tensor data hashes are part of
 * the metadata, so this one hash covers header and data; a relabelled dtype, a deleted field or an
 * edited hash all change it.
 */
function headerHash(metadata: Record<string, string>, tensors: Iterable<[string, { dtype: string; shape: readonly number[] }]>, pad: string): string {
  const md = Object.entries(metadata)
    .filter(([k]) => k !== MD.headerHash)
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  const ts = [...tensors]
    .filter(([n]) => !n.startsWith(pad))
    .map(([n, t]) => [n, t.dtype, [...t.shape]] as const)
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return Bun.hash.xxHash3(JSON.stringify([md, ts])).toString(16);
}

const isAlive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
};

/**
 * When process `pid` started, in ms since the epoch, from Linux's /proc (start ticks since boot at
 * USER_HZ = 100, against /proc/uptime); null where it cannot be read (another OS, a gone process).
 */
function startedAt(pid: number): number | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // Fields after "(comm) " start at field 3; starttime is field 22.
    const ticks = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19]);
    const uptime = Number(readFileSync("/proc/uptime", "utf8").split(" ")[0]);
    return Number.isFinite(ticks) && Number.isFinite(uptime) ? Date.now() - (uptime - ticks / 100) * 1000 : null;
  } catch {
    return null;
  }
}

/** A file's last modification (ms since the epoch); +∞ when it is gone (so no writer counts as newer). */
const mtimeOf = (file: string): number => {
  try {
    return statSync(file).mtimeMs;
  } catch {
    return Number.POSITIVE_INFINITY;
  }
};

/** Slack for the two clocks compared (10 ms ticks, two reads): a live writer started well before its file's last write. */
const START_SLACK_MS = 250;

/**
 * Whether the writer of a temporary file last written at `mtimeMs` may still be running: its pid is
 * alive and, where the start time can be read, that process started before the write (a pid the
 * system gave to a newer process after the writer died is not it).
 */
const writerAlive = (pid: number, mtimeMs: number): boolean => {
  if (!isAlive(pid)) return false;
  const started = startedAt(pid);
  return started === null || started <= mtimeMs + START_SLACK_MS;
};

// The temporary name of an atomic write (mlx-ffi's safetensors/mmap writers): `.<target>.<pid>.<time>[.<rand>].tmp`.
const TEMP_RE = /^\.(.+)\.(\d+)\.\d+(?:\.[a-z0-9]*)?\.tmp$/;

/**
 * Remove, in `dir`, the temporary files of interrupted saves (a save killed between writing and
 * renaming) whose target name passes `isTarget`, unless their writer is still alive (writerAlive:
 * its pid, not reused by a newer process).
 */
export function removeStaleTempsIn(dir: string, isTarget: (name: string) => boolean): string[] {
  const removed: string[] = [];
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch {
    return removed;
  }
  for (const n of names) {
    const m = TEMP_RE.exec(n);
    if (!m || !isTarget(m[1]!)) continue;
    const pid = Number(m[2]);
    const file = join(dir, n);
    if (pid !== process.pid && writerAlive(pid, mtimeOf(file))) continue;
    try {
      rmSync(file, { force: true });
      removed.push(file);
    } catch {
      // another cleaner got it first
    }
  }
  return removed;
}

/** Remove the temporary files that interrupted saves of `path` left behind (see removeStaleTempsIn). */
export function removeStaleTemps(path: string): string[] {
  const name = basename(path);
  return removeStaleTempsIn(dirname(path), (target) => target === name);
}

/** How one of our cache states is written: mlx-lm's class and its state tree. */
interface LayerPlan {
  cls: string;
  /** File name per CacheState slot, in slot order. */
  names: string[];
  /** mlx-lm's scalars (offset, keep, …): file name → value; "none" entries for a missing state. */
  scalars: [string, number | null][];
}

function planLayer(i: number, signature: string, meta: CacheMeta, slots: number): LayerPlan {
  const offset = meta.offset ?? 0;
  const kv = (cls: string, quantized: boolean, extra: [string, number][]): LayerPlan => {
    const parts = quantized ? 3 : 1;
    const names: string[] = [];
    const scalars: [string, number | null][] = [];
    if (slots === 0) {
      scalars.push([`${i}.0`, null], [`${i}.1`, null]);
    } else {
      for (let side = 0; side < 2; side++) for (let p = 0; p < parts; p++) names.push(quantized ? `${i}.${side}.${p}` : `${i}.${side}`);
    }
    scalars.push([`${i}.2`, offset]);
    extra.forEach(([, v], j) => scalars.push([`${i}.${3 + j}`, v]));
    return { cls, names, scalars };
  };
  let m: RegExpExecArray | null;
  if (signature === "kv:plain") return kv("KVCache", false, []);
  if ((m = /^kv:quant:(\d+):(\d+)$/.exec(signature)))
    return kv("QuantizedKVCache", true, [
      ["group_size", Number(m[2])],
      ["bits", Number(m[1])],
    ]);
  if ((m = /^kv:plain>quant:(\d+):(\d+)@\d+$/.exec(signature))) {
    return meta.quantized === 1
      ? kv("QuantizedKVCache", true, [
          ["group_size", Number(m[2])],
          ["bits", Number(m[1])],
        ])
      : kv("KVCache", false, []);
  }
  if ((m = /^rotating:(\d+):(\d+):kv:plain$/.exec(signature))) {
    return kv("RotatingKVCache", false, [
      ["keep", Number(m[2])],
      ["max_size", Number(m[1])],
      ["_idx", meta.idx ?? 0],
    ]);
  }
  // No mlx-lm class (TurboQuant, quantized rotating windows): our own slots, readable by us only.
  return { cls: `${OWN_CLASS_PREFIX}${signature}`, names: Array.from({ length: slots }, (_, j) => `${i}.${j}`), scalars: [] };
}

/**
 * Save caches and token ids to `path` as one safetensors file in mlx-lm's save_prompt_cache layout
 * (so mlx_lm.generate --prompt-cache-file reads it) with our extras: the model fingerprint, the
 * token ids, each tensor's dtype, shape and hash, and a hash over the header. Tensors are laid out
 * for mapping (aligned, size-prefixed; `saveMappableSafetensors`); the write is atomic (temporary
 * file, fsync, rename), so an existing file at `path` is replaced whole or not at all, and
 * temporary files that killed saves of the same path left behind are removed first. The caches are
 * not changed.
 */
export function savePromptCache(path: string, input: SavePromptCacheInput): SavePromptCacheInfo {
  const { caches, tokens, fingerprint } = input;
  const offset = commonOffset(path, caches);
  if (tokens.length < offset) throw new KvStoreError(path, `${tokens.length} token ids given, but the caches hold ${offset} tokens`);
  for (const t of tokens) if (!Number.isInteger(t) || t < 0 || t > 0x7fffffff) throw new KvStoreError(path, `token id ${t} is not a non-negative int32`);
  if (!fingerprint) throw new KvStoreError(path, "no model fingerprint given");
  const L = caches.length;
  const states = caches.map((c) => c.state());
  const tokenArray = MlxArray.fromNumbers(tokens, [tokens.length], "int32");
  // Row-major copies of the slots (a slice of a growable buffer is strided), evaluated together:
  // hashing and writing then read the same buffers without another copy.
  const slots: MlxArray[][] = [];
  const made: MlxArray[] = [];
  try {
    for (const s of states) slots.push(s.tensors.map((t) => mx.contiguous(t)));
    evaluate(...slots.flat());
    const named: [string, MlxArray][] = [];
    const scalarsMd: [string, string][] = [];
    const classes: string[] = [];
    const layers: KvStoreLayer[] = states.map((s, i) => {
      const plan = planLayer(i, s.signature, s.meta, s.tensors.length);
      classes.push(plan.cls);
      slots[i]!.forEach((t, j) => named.push([plan.names[j]!, t]));
      for (const [name, v] of plan.scalars) {
        const a = v === null ? MlxArray.fromNumbers([], [0], "float32") : MlxArray.scalar(v, "int32");
        made.push(a);
        named.push([name, a]);
        scalarsMd.push([name, v === null ? "none" : "scalar"]);
      }
      return {
        class: plan.cls,
        signature: s.signature,
        meta: { ...s.meta },
        minimumReusableOffset: caches[i]!.minimumReusableOffset,
        tensors: slots[i]!.map((t, j) => ({ name: plan.names[j]!, dtype: t.dtype, shape: [...t.shape], xxh3: hashBytes(t) })),
      };
    });
    named.push([tokensTensor(L), tokenArray]);
    const metadata: Record<string, string> = {
      [MD.model]: input.model ?? "",
      [MD.tokenizerConfig]: JSON.stringify(input.tokenizerConfig ?? { trust_remote_code: false }),
      [MD.format]: KV_STORE_FORMAT,
      [MD.version]: String(KV_STORE_VERSION),
      [MD.fingerprint]: fingerprint,
      [MD.created]: new Date().toISOString(),
      [MD.offset]: String(offset),
      [MD.tokenCount]: String(tokens.length),
      [MD.layers]: JSON.stringify(layers),
      [MD.mlx]: mlxVersion(),
      [MD.tokensHash]: hashBytes(tokenArray),
    };
    classes.forEach((c, i) => (metadata[`1.${i}`] = c));
    metadata["2.0"] = "";
    scalarsMd.forEach(([name, type], k) => {
      metadata[`2.${k + 1}.0`] = name;
      metadata[`2.${k + 1}.1`] = type;
    });
    metadata[MD.headerHash] = headerHash(
      metadata,
      named.map(([n, a]) => [n, { dtype: a.dtype, shape: a.shape }]),
      padPrefix(L),
    );
    const removedTemps = removeStaleTemps(path);
    let info;
    try {
      info = saveMappableSafetensors(path, named, metadata, { padPrefix: padPrefix(L) });
    } catch (e) {
      throw new KvStoreError(path, `could not write the snapshot: ${(e as Error).message}`, { cause: e });
    }
    const cacheBytes = slots.flat().reduce((n, a) => n + a.nbytes, 0);
    return {
      path,
      bytes: info.bytes,
      cacheBytes,
      offset,
      bytesPerToken: offset ? cacheBytes / offset : 0,
      mlxLmReadable: classes.every((c) => MLX_LM_CLASSES.includes(c)),
      removedTemps,
    };
  } finally {
    tokenArray.dispose();
    for (const a of made) a.dispose();
    for (const a of slots.flat()) a.dispose();
    for (const s of states) s[Symbol.dispose]();
  }
}

function intField(path: string, md: Record<string, string>, key: string): number {
  const v = md[key];
  const n = v === undefined ? NaN : Number(v);
  if (!Number.isInteger(n) || n < 0) throw new KvStoreError(path, `metadata ${key} is ${v === undefined ? "missing" : JSON.stringify(v)}: corrupt snapshot`);
  return n;
}

function parseLayers(path: string, raw: string | undefined): KvStoreLayer[] {
  let json: unknown;
  try {
    json = JSON.parse(raw ?? "");
  } catch {
    throw new KvStoreError(path, `metadata ${MD.layers} is ${raw === undefined ? "missing" : "not valid JSON"}: corrupt snapshot`);
  }
  const bad = (i: number, what: string): never => {
    throw new KvStoreError(path, `metadata ${MD.layers}[${i}]: ${what}: corrupt snapshot`);
  };
  if (!Array.isArray(json)) throw new KvStoreError(path, `metadata ${MD.layers} is not a list: corrupt snapshot`);
  return json.map((l: unknown, i): KvStoreLayer => {
    if (typeof l !== "object" || l === null) bad(i, "not an object");
    const e = l as Record<string, unknown>;
    if (typeof e.class !== "string") bad(i, "class is not a string");
    if (typeof e.signature !== "string") bad(i, "signature is not a string");
    if (!Number.isInteger(e.minimumReusableOffset)) bad(i, "minimumReusableOffset is not an integer");
    const meta = e.meta;
    if (typeof meta !== "object" || meta === null || Array.isArray(meta) || !Object.values(meta).every((v) => typeof v === "number"))
      bad(i, "meta is not an object of numbers");
    if (!Array.isArray(e.tensors)) bad(i, "tensors is not a list");
    const tensors = (e.tensors as unknown[]).map((t, j): KvStoreTensor => {
      const x = t as Record<string, unknown>;
      if (typeof x !== "object" || x === null || typeof x.name !== "string" || typeof x.dtype !== "string" || typeof x.xxh3 !== "string")
        bad(i, `tensor ${j} lacks name, dtype or xxh3`);
      if (!Array.isArray(x.shape) || !x.shape.every((d) => Number.isInteger(d) && d >= 0)) bad(i, `tensor ${j} has no shape`);
      return { name: x.name as string, dtype: x.dtype as Dtype, shape: x.shape as number[], xxh3: x.xxh3 as string };
    });
    return {
      class: e.class as string,
      signature: e.signature as string,
      meta: meta as CacheMeta,
      minimumReusableOffset: e.minimumReusableOffset as number,
      tensors,
    };
  });
}

/** Layers listed in the metadata (`1.0`, `1.1`, …: mlx-lm's class list). */
function classCount(md: Record<string, string>): number {
  let i = 0;
  while (md[`1.${i}`] !== undefined) i++;
  return i;
}

/** Our header: format, version, header hash, fingerprint, layers, token ids; every tensor against the metadata. */
function checkOwnHeader(path: string, header: SafetensorsHeader, bytes: number): KvStoreInfo {
  const md = header.metadata;
  const version = Number(md[MD.version]);
  if (version !== KV_STORE_VERSION) {
    throw new KvStoreError(path, `format version ${md[MD.version] ?? "(missing)"}, but this build reads version ${KV_STORE_VERSION}; save the snapshot again`);
  }
  const want = md[MD.headerHash];
  if (!want) throw new KvStoreError(path, `metadata ${MD.headerHash} is missing: corrupt or edited snapshot`);
  const got = headerHash(
    md,
    [...header.tensors].map(([n, t]) => [n, { dtype: t.dtype, shape: t.shape }]),
    padPrefix(classCount(md)),
  );
  if (got !== want) throw new KvStoreError(path, "the header does not match its hash (a field edited, deleted or relabelled): corrupt or edited snapshot");
  const fingerprint = md[MD.fingerprint];
  if (!fingerprint) throw new KvStoreError(path, `metadata ${MD.fingerprint} is missing: corrupt snapshot`);
  if (!md[MD.tokensHash]) throw new KvStoreError(path, `metadata ${MD.tokensHash} is missing: corrupt snapshot`);
  const offset = intField(path, md, MD.offset);
  const tokenCount = intField(path, md, MD.tokenCount);
  if (tokenCount < offset) throw new KvStoreError(path, `holds ${tokenCount} token ids for ${offset} cached tokens: corrupt snapshot`);
  const layers = parseLayers(path, md[MD.layers]);
  const tok = header.tensors.get(tokensTensor(layers.length));
  if (!tok || tok.dtype !== "int32" || tok.shape.length !== 1 || tok.shape[0] !== tokenCount) {
    throw new KvStoreError(
      path,
      `tensor '${tokensTensor(layers.length)}' is ${tok ? `${tok.dtype} [${tok.shape}]` : "missing"}, expected int32 [${tokenCount}]: corrupt snapshot`,
    );
  }
  layers.forEach((l, i) => {
    if (md[`1.${i}`] !== l.class)
      throw new KvStoreError(path, `metadata 1.${i} (${md[`1.${i}`] ?? "missing"}) differs from layer ${i}'s class ${l.class}: corrupt snapshot`);
    for (const t of l.tensors) {
      const h = header.tensors.get(t.name);
      if (!h) throw new KvStoreError(path, `tensor '${t.name}' (layer ${i}, ${l.signature}) is missing: corrupt snapshot`);
      if (h.dtype !== t.dtype || h.shape.join() !== t.shape.join()) {
        throw new KvStoreError(
          path,
          `tensor '${t.name}' (layer ${i}) is ${h.dtype} [${h.shape}] in the header, ${t.dtype} [${t.shape}] in the metadata: corrupt snapshot`,
        );
      }
    }
  });
  let tokenizerConfig: Record<string, unknown> | null = null;
  try {
    tokenizerConfig = md[MD.tokenizerConfig] ? (JSON.parse(md[MD.tokenizerConfig]!) as Record<string, unknown>) : null;
  } catch {
    tokenizerConfig = null;
  }
  return {
    path,
    format: "mlx-bun",
    formatVersion: version,
    fingerprint,
    model: md[MD.model] || null,
    tokenizerConfig,
    created: md[MD.created] ?? "",
    offset,
    tokenCount,
    layers,
    bytes,
    mlxVersion: md[MD.mlx] ?? "",
  };
}

/** A scalar tensor's value (mlx-lm writes Python ints as int32 0-d arrays). */
function scalarValue(path: string, header: SafetensorsHeader, file: ReturnType<typeof mapSafetensors> | null, name: string): number | null {
  const h = header.tensors.get(name);
  if (!h) throw new KvStoreError(path, `tensor '${name}' (a scalar of mlx-lm's cache state) is missing: corrupt file`);
  if (!file) return null;
  const a = file.tensors.get(name)!;
  if (a.size !== 1) throw new KvStoreError(path, `tensor '${name}' should be a scalar, it is ${a.describe()}: corrupt file`);
  const v = a.item();
  if (!Number.isFinite(v)) throw new KvStoreError(path, `tensor '${name}' holds ${v}: corrupt file`);
  return v;
}

/**
 * mlx-lm's header: cache classes, scalars and state tensors by save_prompt_cache's naming. With
 * `file` (mapped), the scalar values are read too (offset, keep, max_size, _idx, group_size, bits).
 */
function checkMlxLmHeader(path: string, header: SafetensorsHeader, bytes: number, file: ReturnType<typeof mapSafetensors> | null): KvStoreInfo {
  const md = header.metadata;
  const classes: string[] = [];
  for (let i = 0; md[`1.${i}`] !== undefined; i++) classes.push(md[`1.${i}`]!);
  const types = new Map<string, string>();
  for (let k = 1; md[`2.${k}.0`] !== undefined; k++) types.set(md[`2.${k}.0`]!, md[`2.${k}.1`] ?? "");
  for (const [name, t] of types) {
    if (t !== "scalar" && t !== "none" && t !== "string")
      throw new KvStoreError(path, `metadata scalar type ${JSON.stringify(t)} of '${name}' is unknown: corrupt file`);
  }
  const layers = classes.map((cls, i): KvStoreLayer => {
    if (!MLX_LM_CLASSES.includes(cls)) {
      throw new KvStoreError(path, `layer ${i} is an mlx-lm ${cls}; mlx-bun reads KVCache, RotatingKVCache and QuantizedKVCache (Gemma 4's caches)`);
    }
    const quantized = cls === "QuantizedKVCache";
    const nScalars = cls === "KVCache" ? 1 : cls === "RotatingKVCache" ? 4 : 3;
    const sc = (j: number): number | null => {
      const name = `${i}.${2 + j}`;
      if (types.get(name) !== "scalar") throw new KvStoreError(path, `layer ${i} (${cls}): '${name}' is not listed as a scalar: corrupt file`);
      return scalarValue(path, header, file, name);
    };
    const vals = Array.from({ length: nScalars }, (_, j) => sc(j));
    const empty = types.get(`${i}.0`) === "none";
    const names: string[] = [];
    if (!empty) for (let side = 0; side < 2; side++) for (let p = 0; p < (quantized ? 3 : 1); p++) names.push(quantized ? `${i}.${side}.${p}` : `${i}.${side}`);
    const tensors = names.map((name): KvStoreTensor => {
      const h = header.tensors.get(name);
      if (!h) throw new KvStoreError(path, `tensor '${name}' (layer ${i}, ${cls}) is missing: corrupt file`);
      if (h.shape.length !== 4) throw new KvStoreError(path, `tensor '${name}' (layer ${i}) is [${h.shape}], not [B, H, T, D]: corrupt file`);
      return { name, dtype: h.dtype, shape: [...h.shape] };
    });
    const meta: CacheMeta = {};
    if (vals[0] !== null) meta.offset = vals[0]!;
    if (cls === "RotatingKVCache" && vals[1] !== null) Object.assign(meta, { keep: vals[1]!, maxSize: vals[2]!, idx: vals[3]! });
    if (quantized && vals[1] !== null) Object.assign(meta, { groupSize: vals[1]!, bits: vals[2]! });
    return { class: cls, signature: null, meta, minimumReusableOffset: quantized ? (meta.offset ?? 0) : 0, tensors };
  });
  if (!layers.length) throw new KvStoreError(path, "mlx-lm prompt cache with no layers: corrupt file");
  let tokenizerConfig: Record<string, unknown> | null = null;
  try {
    tokenizerConfig = md[MD.tokenizerConfig] ? (JSON.parse(md[MD.tokenizerConfig]!) as Record<string, unknown>) : null;
  } catch {
    throw new KvStoreError(path, `metadata ${MD.tokenizerConfig} is not JSON: corrupt file`);
  }
  const offsets = new Set(layers.map((l) => l.meta.offset));
  if (file && offsets.size > 1) throw new KvStoreError(path, `the layers hold different token counts (${[...offsets].join(", ")}): corrupt file`);
  return {
    path,
    format: "mlx-lm",
    formatVersion: 0,
    fingerprint: null,
    model: md[MD.model] ?? null,
    tokenizerConfig,
    created: "",
    offset: layers[0]!.meta.offset ?? 0,
    tokenCount: null,
    layers,
    bytes,
    mlxVersion: "",
  };
}

function readHeader(path: string): { header: SafetensorsHeader; bytes: number } {
  let header: SafetensorsHeader;
  try {
    header = readSafetensorsHeader(path);
  } catch (e) {
    throw new KvStoreError(path, `not a readable snapshot: ${(e as Error).message}`, { cause: e });
  }
  let bytes = header.dataStart;
  for (const t of header.tensors.values()) bytes = Math.max(bytes, header.dataStart + t.dataOffsets[1]);
  try {
    bytes = statSync(path).size;
  } catch {
    // the header was just read; keep the size it implies
  }
  return { header, bytes };
}

function formatOf(path: string, header: SafetensorsHeader): "mlx-bun" | "mlx-lm" {
  const md = header.metadata;
  if (md[MD.format] !== undefined) {
    if (md[MD.format] !== KV_STORE_FORMAT)
      throw new KvStoreError(path, `not an mlx-bun KV snapshot (metadata ${MD.format} is ${JSON.stringify(md[MD.format])})`);
    return "mlx-bun";
  }
  if (md[V1_FORMAT_KEY] === KV_STORE_FORMAT) {
    throw new KvStoreError(
      path,
      `format version ${md["mlx_bun.format_version"] ?? 1} (an older mlx-bun), but this build reads version ${KV_STORE_VERSION}; save the snapshot again`,
    );
  }
  if (md["1.0"] !== undefined && md["2.0"] !== undefined) return "mlx-lm";
  throw new KvStoreError(
    path,
    `not a prompt cache: neither an mlx-bun KV snapshot (metadata ${MD.format}) nor mlx-lm's save_prompt_cache format (cache classes in metadata 1.<i>)`,
  );
}

/** Read and check a snapshot's header and metadata (no tensor data; mlx-lm's scalars are read): for listings and pre-checks. */
export function readPromptCacheInfo(path: string): KvStoreInfo {
  const { header, bytes } = readHeader(path);
  if (formatOf(path, header) === "mlx-bun") return checkOwnHeader(path, header, bytes);
  let file: ReturnType<typeof mapSafetensors> | null = null;
  try {
    file = mapSafetensors(path, { padPrefix: padPrefix(classCount(header.metadata)) });
  } catch (e) {
    throw new KvStoreError(path, `could not map the file: ${(e as Error).message}`, { cause: e });
  }
  try {
    return checkMlxLmHeader(path, header, bytes, file);
  } finally {
    file[Symbol.dispose]();
  }
}

/** The K/V geometry a model's layer expects (for files without our fingerprint). */
export interface LayerShape {
  kvHeads: number;
  headDim: number;
}

export interface LoadPromptCacheOptions {
  /**
   * LoadedModel.fingerprint of the model that will use the caches: a file of ours from another
   * model is refused. mlx-lm's files carry none; they are checked by structure (classes, windows,
   * shapes), and by `layerShapes` when given.
   */
  fingerprint: string;
  /**
   * Makes the empty caches the model would use (e.g. `() => model.makeCaches(mode)`): for our
   * files their signatures must match the file's layer by layer; mlx-lm's classes are mapped onto
   * them (KVCache → a plain or quantize-after KVCache, RotatingKVCache → a plain RotatingKVCache of
   * the same window, QuantizedKVCache → an affine or quantize-after KVCache of the same bits and
   * group size). They are filled and returned, or disposed on failure.
   */
  makeCaches: () => Cache[];
  /** Hash every tensor and compare with the hashes saved (ours; default true; reads the whole file once). */
  verify?: boolean;
  /** Per cache layer, the K/V heads and head dim the model uses (checked for every file). */
  layerShapes?: readonly LayerShape[];
}

/** A restored snapshot. The caches are the caller's (dispose them, or call `dispose()`). */
export interface LoadedPromptCache extends Disposable {
  caches: Cache[];
  /** All stored token ids (ours; the caches hold the first `offset`, the rest were never fed); null for mlx-lm's files. */
  tokens: number[] | null;
  offset: number;
  info: KvStoreInfo;
  /** Cache tensors read in place from the mapped file (the rest were copied by the backend). */
  mapped: number;
  /** Cache tensors in the file. */
  tensors: number;
  dispose(): void;
}

/** What kind of cache `c` is, for mapping mlx-lm's classes onto it. */
function targetKind(c: Cache): {
  kind: "plain" | "affine" | "rotating" | "after" | "other";
  bits?: number;
  groupSize?: number;
  maxSize?: number;
  keep?: number;
} {
  if (c instanceof QuantizeAfterKVCache) return { kind: "after", bits: c.bits, groupSize: c.groupSize };
  if (c instanceof KVCache) {
    if (c.codec.name === "kv:plain") return { kind: "plain" };
    const m = /^kv:quant:(\d+):(\d+)$/.exec(c.codec.name);
    if (m) return { kind: "affine", bits: Number(m[1]), groupSize: Number(m[2]) };
  }
  if (c instanceof RotatingKVCache && c.codec.name === "kv:plain") return { kind: "rotating", maxSize: c.maxSize, keep: c.keep };
  return { kind: "other" };
}

/** The CacheState for target cache `c` from an mlx-lm layer (slots sliced to the offset). */
function mlxLmState(path: string, i: number, l: KvStoreLayer, c: Cache, slots: MlxArray[]): { signature: string; tensors: MlxArray[]; meta: CacheMeta } {
  const t = targetKind(c);
  const offset = l.meta.offset ?? 0;
  const mismatch = (what: string): never => {
    throw new KvStoreError(path, `layer ${i}: the file has an mlx-lm ${l.class}${what}, this model's layer ${i} is ${c.signature()}`);
  };
  const held = slots[0]?.shape[2] ?? 0;
  const cut = (n: number): MlxArray[] =>
    slots.map((s) => (s.shape[2]! > n ? mx.slice(s, [0, 0, 0, 0], [s.shape[0]!, s.shape[1]!, n, s.shape[3]!]) : s.retain()));
  if (l.class === "KVCache") {
    if (t.kind !== "plain" && t.kind !== "after") mismatch("");
    if (slots.length && held < offset) mismatch(` holding ${held} of ${offset} tokens`);
    const tensors = offset ? cut(offset) : [];
    return { signature: c.signature(), tensors, meta: t.kind === "after" ? { offset, quantized: 0 } : { offset } };
  }
  if (l.class === "QuantizedKVCache") {
    const { bits, groupSize } = l.meta;
    if ((t.kind !== "affine" && t.kind !== "after") || t.bits !== bits || t.groupSize !== groupSize) mismatch(` (${bits} bits, group size ${groupSize})`);
    if (slots.length && held < offset) mismatch(` holding ${held} of ${offset} tokens`);
    const tensors = offset ? cut(offset) : [];
    return { signature: c.signature(), tensors, meta: t.kind === "after" ? { offset, quantized: 1 } : { offset } };
  }
  // RotatingKVCache: keys, values, offset, keep, max_size, _idx.
  const { keep, maxSize, idx } = l.meta as { keep: number; maxSize: number; idx: number };
  if (t.kind !== "rotating" || t.maxSize !== maxSize || t.keep !== keep) mismatch(` (max_size ${maxSize}, keep ${keep})`);
  if (!offset) return { signature: c.signature(), tensors: [], meta: { offset: 0, idx: 0, keep, maxSize } };
  // Below its capacity mlx-lm's ring is not wrapped and idx == offset: the slots past it are unused.
  if (held > offset) {
    if (idx !== offset) mismatch(` whose write index ${idx} differs from its offset ${offset} below capacity (corrupt?)`);
    return { signature: c.signature(), tensors: cut(offset), meta: { offset, idx: offset, keep, maxSize } };
  }
  if (!Number.isInteger(idx) || idx < 0 || idx > held) mismatch(` with write index ${idx} outside its ${held} slots (corrupt?)`);
  return { signature: c.signature(), tensors: slots.map((s) => s.retain()), meta: { offset, idx, keep, maxSize } };
}

/**
 * Restore a snapshot saved by `savePromptCache`, or by mlx-lm's save_prompt_cache. Checks, in
 * order: the safetensors header (a truncated or corrupt file, a FIFO or other non-regular file),
 * the format; for ours the version, the header hash, the model fingerprint, the metadata against
 * every tensor's dtype and shape, the layer count and each layer's cache signature against
 * `makeCaches()`, the tensor hashes (`verify`); for mlx-lm's the cache classes, scalars and state
 * tensors against the caches the model makes; then each cache's own restore checks. Any failure is
 * a KvStoreError naming the file and what is wrong; the file is only read, and no caches but the
 * new ones are touched (they are built completely before they are returned).
 */
export function loadPromptCache(path: string, opts: LoadPromptCacheOptions): LoadedPromptCache {
  const { header, bytes } = readHeader(path);
  const format = formatOf(path, header);
  let info = format === "mlx-bun" ? checkOwnHeader(path, header, bytes) : null;
  if (info && info.fingerprint !== opts.fingerprint) {
    throw new KvStoreError(path, `saved from another model (fingerprint ${info.fingerprint}), this model is ${opts.fingerprint}`);
  }
  let mappedFile: ReturnType<typeof mapSafetensors> | undefined;
  let caches: Cache[] = [];
  try {
    try {
      mappedFile = mapSafetensors(path, { padPrefix: padPrefix(classCount(header.metadata)) });
    } catch (e) {
      throw new KvStoreError(path, `could not map the file: ${(e as Error).message}`, { cause: e });
    }
    info ??= checkMlxLmHeader(path, header, bytes, mappedFile);
    const L = info.layers.length;
    caches = opts.makeCaches();
    if (caches.length !== L) throw new KvStoreError(path, `holds ${L} layer caches, the model makes ${caches.length} (another model?)`);
    if (format === "mlx-bun") {
      const wrong = info.layers.flatMap((l, i) =>
        l.signature === caches[i]!.signature() ? [] : [`layer ${i}: file ${l.signature}, model ${caches[i]!.signature()}`],
      );
      if (wrong.length) throw new KvStoreError(path, `cache signatures differ from the caches this model makes (another KV mode?): ${wrong.join("; ")}`);
    }
    const t = mappedFile.tensors;
    if (opts.layerShapes) {
      info.layers.forEach((l, i) => {
        const want = opts.layerShapes![i];
        const k = l.tensors[0];
        if (!want || !k || l.class.startsWith(OWN_CLASS_PREFIX)) return;
        const bits = l.class === "QuantizedKVCache" ? (l.meta.bits ?? Number(/quant:(\d+):/.exec(l.signature ?? "")?.[1] ?? 0)) : 0;
        const dim = bits ? (k.shape[3]! * 32) / bits : k.shape[3]!;
        if (k.shape[0] !== 1 || k.shape[1] !== want.kvHeads || dim !== want.headDim) {
          throw new KvStoreError(
            path,
            `layer ${i}: keys ${k.dtype} [${k.shape}] do not fit this model (batch 1, ${want.kvHeads} KV heads, head dim ${want.headDim}): another model?`,
          );
        }
      });
    }
    const tokName = tokensTensor(L);
    if (format === "mlx-bun" && (opts.verify ?? true)) {
      if (hashBytes(t.get(tokName)!) !== header.metadata[MD.tokensHash])
        throw new KvStoreError(path, `tensor '${tokName}' does not match its saved hash: corrupt data`);
      info.layers.forEach((l, i) => {
        for (const x of l.tensors) {
          if (hashBytes(t.get(x.name)!) !== x.xxh3) throw new KvStoreError(path, `tensor '${x.name}' (layer ${i}) does not match its saved hash: corrupt data`);
        }
      });
    }
    const tokens = format === "mlx-bun" ? (t.get(tokName)!.tolist() as number[]) : null;
    let mapped = 0;
    let count = 0;
    info.layers.forEach((l, i) => {
      const slots: MlxArray[] = [];
      for (const x of l.tensors) {
        if (mappedFile!.mapped.has(x.name)) mapped++;
        slots.push(t.get(x.name)!.retain());
      }
      count += slots.length;
      let state;
      if (format === "mlx-bun") state = makeState(l.signature!, slots, { ...l.meta });
      else {
        try {
          const s = mlxLmState(path, i, l, caches[i]!, slots);
          state = makeState(s.signature, s.tensors, s.meta);
        } finally {
          for (const a of slots) a.dispose();
        }
      }
      try {
        caches[i]!.restoreState(state);
      } catch (e) {
        state[Symbol.dispose]();
        throw new KvStoreError(path, `layer ${i} (${l.signature ?? l.class}) does not restore: ${(e as Error).message}`, { cause: e });
      }
      caches[i]!.minimumReusableOffset = l.minimumReusableOffset;
      if (caches[i]!.offset !== info!.offset)
        throw new KvStoreError(path, `layer ${i} holds ${caches[i]!.offset} tokens, the snapshot says ${info!.offset}: corrupt snapshot`);
    });
    const out = caches;
    const dispose = (): void => {
      for (const c of out) c.dispose();
    };
    return { caches: out, tokens, offset: info.offset, info, mapped, tensors: count, dispose, [Symbol.dispose]: dispose };
  } catch (e) {
    for (const c of caches) c.dispose();
    throw e;
  } finally {
    mappedFile?.[Symbol.dispose]();
  }
}

/** What `verifyPromptCache` checked. */
export interface KvStoreVerification {
  info: KvStoreInfo;
  /** One line per check passed. */
  checks: string[];
  /** What could not be checked (e.g. mlx-lm's files carry no checksum). */
  notes: string[];
}

/**
 * Check a snapshot without a model: the header (and for ours its hash, the metadata against every
 * tensor, every tensor's data hash and the token ids'); for mlx-lm's the classes, scalars and state
 * tensors. Throws KvStoreError on the first failure.
 */
export function verifyPromptCache(path: string): KvStoreVerification {
  const { header, bytes } = readHeader(path);
  const checks = [`safetensors header: ${header.tensors.size} tensors, offsets and sizes within the ${bytes}-byte file`];
  const notes: string[] = [];
  const format = formatOf(path, header);
  let info: KvStoreInfo;
  let file: ReturnType<typeof mapSafetensors>;
  if (format === "mlx-bun") {
    info = checkOwnHeader(path, header, bytes);
    checks.push(`mlx-bun KV snapshot, format version ${info.formatVersion}: header hash matches (metadata, dtypes, shapes)`);
  }
  try {
    file = mapSafetensors(path, { padPrefix: padPrefix(classCount(header.metadata)) });
  } catch (e) {
    throw new KvStoreError(path, `could not map the file: ${(e as Error).message}`, { cause: e });
  }
  try {
    if (format === "mlx-bun") {
      const tokName = tokensTensor(info!.layers.length);
      if (hashBytes(file.tensors.get(tokName)!) !== header.metadata[MD.tokensHash])
        throw new KvStoreError(path, `tensor '${tokName}' does not match its saved hash: corrupt data`);
      let n = 0;
      info!.layers.forEach((l, i) => {
        for (const x of l.tensors) {
          if (hashBytes(file.tensors.get(x.name)!) !== x.xxh3)
            throw new KvStoreError(path, `tensor '${x.name}' (layer ${i}) does not match its saved hash: corrupt data`);
          n++;
        }
      });
      checks.push(`data: ${n} cache tensors and the ${info!.tokenCount} token ids match their xxHash3`);
      const own = info!.layers.filter((l) => l.class.startsWith(OWN_CLASS_PREFIX)).length;
      if (own) notes.push(`${own} of ${info!.layers.length} layers have no mlx-lm class (TurboQuant or quantized window): mlx-lm cannot read this file`);
    } else {
      info = checkMlxLmHeader(path, header, bytes, file);
      checks.push(
        `mlx-lm prompt cache (save_prompt_cache): ${info.layers.length} layers (${[...new Set(info.layers.map((l) => l.class))].join(", ")}), scalars and state tensors present, one offset (${info.offset})`,
      );
      notes.push("mlx-lm's files carry no checksum: the data itself cannot be verified");
    }
  } finally {
    file[Symbol.dispose]();
  }
  return { info: info!, checks, notes };
}
