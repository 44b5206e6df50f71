// Prompt cache: reuse of the longest cached prefix across requests (an LRU under a byte budget).
import { type Cache, KVCache, QuantizeAfterKVCache, RotatingKVCache } from "@mlx-bun/kv-cache";

/** Error for misuse of the prompt cache (mismatched offsets, unknown cache classes). */
export class PromptCacheError extends Error {
  override name = "PromptCacheError";
}

/** Empty caches of the same class, geometry and codec as `like` (KVCache, RotatingKVCache, QuantizeAfterKVCache). */
export function emptyCachesLike(like: readonly Cache[]): Cache[] {
  return like.map((c) => {
    if (c instanceof QuantizeAfterKVCache) return new QuantizeAfterKVCache(c.start, c.bits, c.groupSize);
    if (c instanceof KVCache) return new KVCache(c.codec);
    if (c instanceof RotatingKVCache) return new RotatingKVCache(c.maxSize, c.keep, c.codec);
    throw new PromptCacheError(`prompt cache: cannot copy a ${c.constructor.name} (${c.signature()}); pass makeEmpty for it`);
  });
}

/**
 * Copies of `caches` sharing their arrays (MLX arrays are immutable: no data is copied, and a
 * later write into either side copies that side's buffer first), with minimumReusableOffset kept.
 */
export function copyCaches(caches: readonly Cache[], makeEmpty: (like: readonly Cache[]) => Cache[] = emptyCachesLike): Cache[] {
  const out = makeEmpty(caches);
  try {
    if (out.length !== caches.length) throw new PromptCacheError(`prompt cache: makeEmpty made ${out.length} caches for ${caches.length}`);
    caches.forEach((c, i) => {
      const s = c.state();
      try {
        out[i]!.restoreState(s); // adopts the snapshot's tensors
      } catch (e) {
        s[Symbol.dispose]();
        throw e;
      }
      out[i]!.minimumReusableOffset = c.minimumReusableOffset;
    });
    return out;
  } catch (e) {
    for (const c of out) c.dispose();
    throw e;
  }
}

export interface PromptCacheOptions {
  /** Byte budget: the sum of Cache.nbytes over all entries stays at or below it. */
  maxBytes: number;
  /** Entry cap (default: no cap). */
  maxEntries?: number;
  /** Empty caches like the given ones (default `emptyCachesLike`). */
  makeEmpty?: (like: readonly Cache[]) => Cache[];
}

/** A lookup hit: caches the caller owns, holding `promptIds.slice(0, cachedTokens)`. */
export interface PromptCacheHit extends Disposable {
  caches: Cache[];
  /** Prompt tokens already in `caches`; prefill only `promptIds.slice(cachedTokens)`. */
  cachedTokens: number;
  /** Tokens the entry held before trimming. */
  entryTokens: number;
  /** Tokens trimmed off the entry's copy (entryTokens - cachedTokens). */
  trimmed: number;
  dispose(): void;
}

export interface LookupOptions {
  /** Only entries whose per-layer signatures equal these (e.g. the KV mode the request uses). */
  signatures?: readonly string[];
  /**
   * Where a reused prefix may end: the longest allowed prefix of at most `r` tokens (e.g. an image
   * prompt's: never inside an image's run, images.ts imageCacheKeys). Default: any `r`.
   */
  cut?: (r: number) => number;
}

/** One entry, as `entries()` lists it (most recently used last). */
export interface PromptCacheEntryInfo {
  tokens: number;
  bytes: number;
  signatures: string[];
}

export interface PromptCacheStats {
  hits: number;
  misses: number;
  /** Prompt tokens served from the cache, over all hits. */
  cachedTokens: number;
  inserts: number;
  evictions: number;
}

interface Entry {
  tokens: number[];
  caches: Cache[];
  bytes: number;
  signatures: string[];
  /** Every layer can be trimmed (no rotating window has wrapped). */
  trimmable: boolean;
  /** max over layers of minimumReusableOffset. */
  minReusable: number;
}

function commonPrefix(a: readonly number[], b: readonly number[]): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}

const sameList = (a: readonly string[], b: readonly string[]): boolean => a.length === b.length && a.every((x, i) => x === b[i]);

/**
 * Prefix reuse across requests. Entries are (token ids, per-layer caches) snapshots, kept in LRU
 * order under a byte budget. `lookup` hands out copies (the entry stays for others), trimmed to
 * the longest usable common prefix; `insert` snapshots a request's caches when it ends. Exact
 * rules: docs/runtime-prompt-cache.md.
 */
export class PromptCache implements Disposable {
  #entries: Entry[] = []; // LRU order: least recently used first
  #bytes = 0;
  readonly maxBytes: number;
  readonly maxEntries: number;
  #makeEmpty: (like: readonly Cache[]) => Cache[];
  readonly stats: PromptCacheStats = { hits: 0, misses: 0, cachedTokens: 0, inserts: 0, evictions: 0 };

  constructor(opts: PromptCacheOptions) {
    if (!(opts.maxBytes >= 0)) throw new PromptCacheError(`prompt cache: maxBytes must be >= 0, got ${opts.maxBytes}`);
    const maxEntries = opts.maxEntries ?? Number.POSITIVE_INFINITY;
    if (!(maxEntries >= 0)) throw new PromptCacheError(`prompt cache: maxEntries must be >= 0, got ${opts.maxEntries}`);
    this.maxBytes = opts.maxBytes;
    this.maxEntries = maxEntries;
    this.#makeEmpty = opts.makeEmpty ?? emptyCachesLike;
  }

  /** Sum of Cache.nbytes over all entries. */
  get bytes(): number {
    return this.#bytes;
  }

  get size(): number {
    return this.#entries.length;
  }

  entries(): PromptCacheEntryInfo[] {
    return this.#entries.map((e) => ({ tokens: e.tokens.length, bytes: e.bytes, signatures: [...e.signatures] }));
  }

  /** Tokens of `promptIds` that entry `e` could serve (0 = not usable). */
  #usable(e: Entry, promptIds: readonly number[], cut?: (r: number) => number): number {
    // At least one prompt token is left to run: its logits pick the first new token.
    const common = Math.min(commonPrefix(e.tokens, promptIds), promptIds.length - 1);
    const r = cut ? Math.min(common, cut(common)) : common;
    if (r <= 0) return 0;
    if (r === e.tokens.length) return r; // exact extension: nothing to trim
    if (!e.trimmable || r < e.minReusable) return 0;
    return r;
  }

  /**
   * The entry with the longest usable common prefix with `promptIds`, as caches the caller owns,
   * trimmed to that prefix; null when none is usable. A hit makes the entry most recently used.
   * `promptIds` are the ids the entries are keyed by: token ids, or an image prompt's key ids
   * (negative at image positions: images.ts imageCacheKeys).
   */
  lookup(promptIds: readonly number[], opts: LookupOptions = {}): PromptCacheHit | null {
    let best = -1;
    let bestLen = 0;
    for (let i = 0; i < this.#entries.length; i++) {
      const e = this.#entries[i]!;
      if (opts.signatures && !sameList(opts.signatures, e.signatures)) continue;
      const r = this.#usable(e, promptIds, opts.cut);
      if (r > 0 && r >= bestLen) {
        // later entries are more recent: ties go to the most recently used
        best = i;
        bestLen = r;
      }
    }
    if (best < 0) {
      this.stats.misses++;
      return null;
    }
    const e = this.#entries[best]!;
    const caches = copyCaches(e.caches, this.#makeEmpty);
    const trim = e.tokens.length - bestLen;
    try {
      if (trim > 0) for (const c of caches) c.trim(trim);
    } catch (err) {
      for (const c of caches) c.dispose();
      throw err;
    }
    this.#entries.splice(best, 1);
    this.#entries.push(e);
    this.stats.hits++;
    this.stats.cachedTokens += bestLen;
    const dispose = (): void => {
      for (const c of caches) c.dispose();
    };
    return { caches, cachedTokens: bestLen, entryTokens: e.tokens.length, trimmed: trim, dispose, [Symbol.dispose]: dispose };
  }

  /**
   * Snapshot `caches` (sharing their arrays; the caller still owns and disposes its caches) under
   * `tokens`, the ids they hold (ids past the caches' offset, e.g. the last sampled token that was
   * never fed, are dropped; an image prompt's key ids, negative at image positions). Replaces an entry with the same tokens, drops entries the new one
   * makes redundant, then evicts least recently used entries until the budget holds. Returns
   * false when nothing was kept (empty caches, or one entry larger than the budget).
   */
  insert(tokens: readonly number[], caches: readonly Cache[]): boolean {
    const offsets = new Set(caches.map((c) => c.offset));
    if (offsets.size > 1) throw new PromptCacheError(`prompt cache insert: caches hold different token counts (${[...offsets].join(", ")})`);
    const offset = caches[0]?.offset ?? 0;
    if (tokens.length < offset) throw new PromptCacheError(`prompt cache insert: ${tokens.length} token ids for caches holding ${offset}`);
    if (offset === 0) return false;
    if (this.maxEntries < 1) return false;
    const copy = copyCaches(caches, this.#makeEmpty);
    const entry: Entry = {
      tokens: tokens.slice(0, offset),
      caches: copy,
      // The copy shares the caller's buffers (capacity included), so those are what it holds.
      bytes: Math.max(
        caches.reduce((s, c) => s + c.nbytes, 0),
        copy.reduce((s, c) => s + c.nbytes, 0),
      ),
      signatures: copy.map((c) => c.signature()),
      trimmable: copy.every((c) => c.isTrimmable()),
      minReusable: Math.max(0, ...copy.map((c) => c.minimumReusableOffset)),
    };
    if (entry.bytes > this.maxBytes) {
      // Larger than the whole budget: keep nothing rather than evict everything for it.
      for (const c of copy) c.dispose();
      return false;
    }
    this.stats.inserts++;
    // An existing entry is redundant when the new one holds its tokens as a prefix and can serve
    // every prompt it could (same signatures, trimmable, no higher reuse floor).
    this.#entries = this.#entries.filter((old) => {
      const redundant =
        sameList(old.signatures, entry.signatures) &&
        old.tokens.length <= entry.tokens.length &&
        commonPrefix(old.tokens, entry.tokens) === old.tokens.length &&
        (old.tokens.length === entry.tokens.length || (entry.trimmable && entry.minReusable <= (old.trimmable ? old.minReusable : old.tokens.length)));
      if (redundant) this.#drop(old);
      return !redundant;
    });
    this.#entries.push(entry);
    this.#bytes += entry.bytes;
    this.#evict();
    return this.#entries.includes(entry);
  }

  #drop(e: Entry): void {
    for (const c of e.caches) c.dispose();
    this.#bytes -= e.bytes;
  }

  #evict(): void {
    while (this.#entries.length && (this.#bytes > this.maxBytes || this.#entries.length > this.maxEntries)) {
      this.#drop(this.#entries.shift()!);
      this.stats.evictions++;
    }
  }

  /**
   * Every entry as token ids and copies of its caches (sharing its arrays; the caller owns and
   * disposes them), least recently used first: for persisting the cache (e.g. at shutdown).
   * Inserting them in this order into an empty cache restores the same entries and LRU order.
   * Entries keyed through images (negative key ids) are left out: their keys are no token ids.
   */
  snapshot(): { tokens: number[]; caches: Cache[] }[] {
    const out: { tokens: number[]; caches: Cache[] }[] = [];
    try {
      for (const e of this.#entries) if (e.tokens.every((t) => t >= 0)) out.push({ tokens: [...e.tokens], caches: copyCaches(e.caches, this.#makeEmpty) });
    } catch (err) {
      for (const o of out) for (const c of o.caches) c.dispose();
      throw err;
    }
    return out;
  }

  /** Drop every entry. */
  clear(): void {
    for (const e of this.#entries) this.#drop(e);
    this.#entries = [];
    this.#bytes = 0;
  }

  dispose(): void {
    this.clear();
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}
