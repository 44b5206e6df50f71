// kv-store: persist a prompt cache (a model's per-layer caches plus the token ids they hold) as one
// safetensors file, and restore it by mapping the file instead of re-running the prompt.
import { toArrayBuffer } from "bun:ffi";
import { statSync } from "node:fs";
import { type Cache, type CacheMeta, makeState } from "@mlx-bun/kv-cache";
import * as mx from "@mlx-bun/mlx-ops";
import {
  checkHandle,
  evaluate,
  lib,
  mapSafetensors,
  MlxArray,
  mlxVersion,
  readSafetensorsHeader,
  saveMappableSafetensors,
  type SafetensorsHeader,
} from "@mlx-bun/mlx-ffi";

/** Written into every snapshot; a file without it is not a KV snapshot. */
export const KV_STORE_FORMAT = "mlx-bun/kv-store";
/** Bumped when the layout or the metadata changes incompatibly; other versions are refused. */
export const KV_STORE_VERSION = 1;

const K = {
  format: "mlx_bun.format",
  version: "mlx_bun.format_version",
  fingerprint: "mlx_bun.model_fingerprint",
  created: "mlx_bun.created",
  offset: "mlx_bun.offset",
  tokenCount: "mlx_bun.token_count",
  layers: "mlx_bun.layers",
  mlx: "mlx_bun.mlx_version",
  tokensHash: "mlx_bun.tokens_xxh3",
} as const;

/** Tensor names: `tokens` (int32 [N]) and `cache.<layer>.<slot>` (the slots of CacheState.tensors). */
export const TOKENS_TENSOR = "tokens";
export const slotName = (layer: number, slot: number): string => `cache.${layer}.${slot}`;

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

/** One layer's entry in the file's metadata. */
export interface KvStoreLayer {
  signature: string;
  meta: CacheMeta;
  /** Number of `cache.<i>.<slot>` tensors. */
  tensors: number;
  minimumReusableOffset: number;
  /** xxHash3 (64-bit, hex) of each slot's bytes, checked on load when `verify` is on. */
  xxh3: string[];
}

/** What a snapshot file says about itself (header only; no tensor data read). */
export interface KvStoreInfo {
  path: string;
  formatVersion: number;
  fingerprint: string;
  /** ISO 8601 creation time. */
  created: string;
  /** Tokens every cache holds. */
  offset: number;
  /** Token ids stored (>= offset: the ones past the offset were never fed to the model). */
  tokenCount: number;
  layers: KvStoreLayer[];
  /** File size in bytes. */
  bytes: number;
  /** The MLX version that wrote the file (informational). */
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
}

export interface SavePromptCacheInfo {
  path: string;
  /** File size. */
  bytes: number;
  /** Bytes of cache tensors (padding and token ids excluded). */
  cacheBytes: number;
  offset: number;
  /** cacheBytes / offset (0 for an empty cache). */
  bytesPerToken: number;
}

function hashArray(a: MlxArray): string {
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
 * Save caches and token ids to `path` as one safetensors file (see docs: "KV store"). Tensors are
 * laid out for mapping (aligned, size-prefixed; `saveMappableSafetensors`); the write is atomic
 * (temporary file, fsync, rename), so an existing file at `path` is replaced whole or not at all.
 * The caches are not changed.
 */
export function savePromptCache(path: string, input: SavePromptCacheInput): SavePromptCacheInfo {
  const { caches, tokens, fingerprint } = input;
  const offset = commonOffset(path, caches);
  if (tokens.length < offset) throw new KvStoreError(path, `${tokens.length} token ids given, but the caches hold ${offset} tokens`);
  for (const t of tokens) if (!Number.isInteger(t) || t < 0 || t > 0x7fffffff) throw new KvStoreError(path, `token id ${t} is not a non-negative int32`);
  if (!fingerprint) throw new KvStoreError(path, "no model fingerprint given");
  const states = caches.map((c) => c.state());
  const tokenArray = MlxArray.fromNumbers(tokens, [tokens.length], "int32");
  // Row-major copies of the slots (a slice of a growable buffer is strided), evaluated together:
  // hashing and writing then read the same buffers without another copy.
  const slots: MlxArray[][] = [];
  try {
    for (const s of states) slots.push(s.tensors.map((t) => mx.contiguous(t)));
    evaluate(...slots.flat());
    const named: [string, MlxArray][] = [[TOKENS_TENSOR, tokenArray]];
    const layers: KvStoreLayer[] = states.map((s, i) => {
      slots[i]!.forEach((t, j) => named.push([slotName(i, j), t]));
      return {
        signature: s.signature,
        meta: { ...s.meta },
        tensors: s.tensors.length,
        minimumReusableOffset: caches[i]!.minimumReusableOffset,
        xxh3: slots[i]!.map(hashArray),
      };
    });
    const metadata: Record<string, string> = {
      [K.format]: KV_STORE_FORMAT,
      [K.version]: String(KV_STORE_VERSION),
      [K.fingerprint]: fingerprint,
      [K.created]: new Date().toISOString(),
      [K.offset]: String(offset),
      [K.tokenCount]: String(tokens.length),
      [K.layers]: JSON.stringify(layers),
      [K.mlx]: mlxVersion(),
      [K.tokensHash]: hashArray(tokenArray),
    };
    let info;
    try {
      info = saveMappableSafetensors(path, named, metadata);
    } catch (e) {
      throw new KvStoreError(path, `could not write the snapshot: ${(e as Error).message}`, { cause: e });
    }
    const cacheBytes = info.dataBytes - tokenArray.nbytes;
    return { path, bytes: info.bytes, cacheBytes, offset, bytesPerToken: offset ? cacheBytes / offset : 0 };
  } finally {
    tokenArray.dispose();
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
    throw new KvStoreError(path, `metadata ${K.layers} is ${raw === undefined ? "missing" : "not valid JSON"}: corrupt snapshot`);
  }
  const bad = (i: number, what: string): never => {
    throw new KvStoreError(path, `metadata ${K.layers}[${i}]: ${what}: corrupt snapshot`);
  };
  if (!Array.isArray(json)) throw new KvStoreError(path, `metadata ${K.layers} is not a list: corrupt snapshot`);
  return json.map((l: unknown, i): KvStoreLayer => {
    if (typeof l !== "object" || l === null) bad(i, "not an object");
    const e = l as Record<string, unknown>;
    if (typeof e.signature !== "string") bad(i, "signature is not a string");
    if (!Number.isInteger(e.tensors) || (e.tensors as number) < 0) bad(i, "tensors is not a count");
    if (!Number.isInteger(e.minimumReusableOffset)) bad(i, "minimumReusableOffset is not an integer");
    const meta = e.meta;
    if (typeof meta !== "object" || meta === null || Array.isArray(meta) || !Object.values(meta).every((v) => typeof v === "number")) bad(i, "meta is not an object of numbers");
    const h = e.xxh3;
    if (!Array.isArray(h) || h.length !== e.tensors || !h.every((x) => typeof x === "string")) bad(i, "xxh3 does not list one hash per tensor");
    return {
      signature: e.signature as string,
      meta: meta as CacheMeta,
      tensors: e.tensors as number,
      minimumReusableOffset: e.minimumReusableOffset as number,
      xxh3: h as string[],
    };
  });
}

function checkHeader(path: string, header: SafetensorsHeader, bytes: number): KvStoreInfo {
  const md = header.metadata;
  if (md[K.format] !== KV_STORE_FORMAT) {
    throw new KvStoreError(path, `not an mlx-bun KV snapshot (metadata ${K.format} is ${md[K.format] === undefined ? "missing" : JSON.stringify(md[K.format])})`);
  }
  const version = Number(md[K.version]);
  if (version !== KV_STORE_VERSION) {
    throw new KvStoreError(path, `format version ${md[K.version] ?? "(missing)"}, but this build reads version ${KV_STORE_VERSION}; save the snapshot again`);
  }
  const fingerprint = md[K.fingerprint];
  if (!fingerprint) throw new KvStoreError(path, `metadata ${K.fingerprint} is missing: corrupt snapshot`);
  const offset = intField(path, md, K.offset);
  const tokenCount = intField(path, md, K.tokenCount);
  if (tokenCount < offset) throw new KvStoreError(path, `holds ${tokenCount} token ids for ${offset} cached tokens: corrupt snapshot`);
  const layers = parseLayers(path, md[K.layers]);
  const tok = header.tensors.get(TOKENS_TENSOR);
  if (!tok || tok.dtype !== "int32" || tok.shape.length !== 1 || tok.shape[0] !== tokenCount) {
    throw new KvStoreError(path, `tensor '${TOKENS_TENSOR}' is ${tok ? `${tok.dtype} [${tok.shape}]` : "missing"}, expected int32 [${tokenCount}]: corrupt snapshot`);
  }
  layers.forEach((l, i) => {
    for (let j = 0; j < l.tensors; j++) {
      if (!header.tensors.has(slotName(i, j))) throw new KvStoreError(path, `tensor '${slotName(i, j)}' (layer ${i}, ${l.signature}) is missing: corrupt snapshot`);
    }
  });
  return {
    path,
    formatVersion: version,
    fingerprint,
    created: md[K.created] ?? "",
    offset,
    tokenCount,
    layers,
    bytes,
    mlxVersion: md[K.mlx] ?? "",
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

/** Read and check a snapshot's header and metadata (no tensor data): for listings and pre-checks. */
export function readPromptCacheInfo(path: string): KvStoreInfo {
  const { header, bytes } = readHeader(path);
  return checkHeader(path, header, bytes);
}

export interface LoadPromptCacheOptions {
  /** LoadedModel.fingerprint of the model that will use the caches; another model's file is refused. */
  fingerprint: string;
  /**
   * Makes the empty caches the model would use (e.g. `() => model.makeCaches(mode)`); their
   * signatures must match the file's, layer by layer. They are filled and returned, or disposed
   * on failure.
   */
  makeCaches: () => Cache[];
  /** Hash every tensor and compare with the hashes saved (default true; reads the whole file once). */
  verify?: boolean;
}

/** A restored snapshot. The caches are the caller's (dispose them, or call `dispose()`). */
export interface LoadedPromptCache extends Disposable {
  caches: Cache[];
  /** All stored token ids; the caches hold the first `offset`, the rest were never fed. */
  tokens: number[];
  offset: number;
  info: KvStoreInfo;
  /** Cache tensors read in place from the mapped file (the rest were copied by the backend). */
  mapped: number;
  /** Cache tensors in the file. */
  tensors: number;
  dispose(): void;
}

/**
 * Restore a snapshot saved by `savePromptCache`. Checks, in order: the safetensors header (a
 * truncated or corrupt file), the format marker and version, the model fingerprint, the metadata,
 * the layer count and each layer's cache signature against `makeCaches()`, the tensor hashes
 * (`verify`), then each cache's own restore checks. Any failure is a KvStoreError naming the file
 * and what is wrong; the file is only read, and no caches but the new ones are touched (they are
 * built completely before they are returned).
 */
export function loadPromptCache(path: string, opts: LoadPromptCacheOptions): LoadedPromptCache {
  const { header, bytes } = readHeader(path);
  const info = checkHeader(path, header, bytes);
  if (info.fingerprint !== opts.fingerprint) {
    throw new KvStoreError(path, `saved from another model (fingerprint ${info.fingerprint}), this model is ${opts.fingerprint}`);
  }
  const caches = opts.makeCaches();
  let mappedFile: ReturnType<typeof mapSafetensors> | undefined;
  try {
    if (caches.length !== info.layers.length) {
      throw new KvStoreError(path, `holds ${info.layers.length} layer caches, the model makes ${caches.length}`);
    }
    const wrong = info.layers.flatMap((l, i) => (l.signature === caches[i]!.signature() ? [] : [`layer ${i}: file ${l.signature}, model ${caches[i]!.signature()}`]));
    if (wrong.length) throw new KvStoreError(path, `cache signatures differ from the caches this model makes (another KV mode?): ${wrong.join("; ")}`);
    try {
      mappedFile = mapSafetensors(path);
    } catch (e) {
      throw new KvStoreError(path, `could not map the file: ${(e as Error).message}`, { cause: e });
    }
    const t = mappedFile.tensors;
    const tokArray = t.get(TOKENS_TENSOR)!;
    if (opts.verify ?? true) {
      const want = header.metadata[K.tokensHash];
      if (want !== undefined && hashArray(tokArray) !== want) throw new KvStoreError(path, `tensor '${TOKENS_TENSOR}' does not match its saved hash: corrupt data`);
      info.layers.forEach((l, i) => {
        for (let j = 0; j < l.tensors; j++) {
          if (hashArray(t.get(slotName(i, j))!) !== l.xxh3[j]) throw new KvStoreError(path, `tensor '${slotName(i, j)}' (layer ${i}) does not match its saved hash: corrupt data`);
        }
      });
    }
    const tokens = tokArray.tolist() as number[];
    let mapped = 0;
    let count = 0;
    info.layers.forEach((l, i) => {
      const slots: MlxArray[] = [];
      for (let j = 0; j < l.tensors; j++) {
        const a = t.get(slotName(i, j))!;
        if (mappedFile!.mapped.has(slotName(i, j))) mapped++;
        slots.push(a.retain());
      }
      count += slots.length;
      const state = makeState(l.signature, slots, { ...l.meta });
      try {
        caches[i]!.restoreState(state);
      } catch (e) {
        state[Symbol.dispose]();
        throw new KvStoreError(path, `layer ${i} (${l.signature}) does not restore: ${(e as Error).message}`, { cause: e });
      }
      caches[i]!.minimumReusableOffset = l.minimumReusableOffset;
      if (caches[i]!.offset !== info.offset) throw new KvStoreError(path, `layer ${i} holds ${caches[i]!.offset} tokens, the snapshot says ${info.offset}: corrupt snapshot`);
    });
    const dispose = (): void => {
      for (const c of caches) c.dispose();
    };
    return { caches, tokens, offset: info.offset, info, mapped, tensors: count, dispose, [Symbol.dispose]: dispose };
  } catch (e) {
    for (const c of caches) c.dispose();
    throw e;
  } finally {
    mappedFile?.[Symbol.dispose]();
  }
}
