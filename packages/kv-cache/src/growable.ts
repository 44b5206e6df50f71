// KVCache: the growable layout (mlx-lm's KVCache / QuantizedKVCache), over any codec.
import type { MlxArray } from "@mlx-bun/mlx-ffi";
import { type KvCodec, plainCodec } from "./codec.ts";
import { linearMask } from "./mask.ts";
import { appendGrowing, disposeAll, PlaneLayout, tokens } from "./planes.ts";
import { type Cache, type CacheState, type KvView, type Mask, fail, checkTrim } from "./types.ts";

/** A snapshot that owns its tensors. */
export function makeState(signature: string, tensors: MlxArray[], meta: Record<string, number>): CacheState {
  return { signature, tensors, meta, [Symbol.dispose]: () => disposeAll(tensors) };
}

/**
 * Grows in steps of 256 tokens; writes each chunk with slice_update and
 * fetches the first `offset` tokens, exactly as mlx-lm's KVCache (plain) and
 * QuantizedKVCache (affine codec). State slots: the codec's planes sliced to
 * `offset` (plain: keys, values; affine: k.w, k.scales, k.biases, v.w,
 * v.scales, v.biases; TurboQuant: k.w, k.scales, k.biases, v.codes, v.scale);
 * meta { offset }.
 */
export class KVCache extends PlaneLayout implements Cache {
  static readonly step = 256;
  #offset = 0;
  minimumReusableOffset = 0;

  constructor(readonly codec: KvCodec = plainCodec) {
    super();
  }

  get offset(): number {
    return this.#offset;
  }

  /** Physical token capacity of the buffers. */
  get capacity(): number {
    return this._planes ? this._planes[0]!.shape[2]! : 0;
  }

  updateAndFetch(k: MlxArray, v: MlxArray): KvView {
    this.codec.check(k, v);
    const enc = this.codec.encode(k, v);
    try {
      const prev = this.#offset;
      const n = k.shape[2]!;
      if (this._planes && this._planes[0]!.shape[0] !== k.shape[0]) {
        fail(`KVCache.updateAndFetch: batch ${k.shape[0]} does not match the cache's ${this._planes[0]!.shape[0]}`);
      }
      this._planes = appendGrowing(this._planes, enc, prev, KVCache.step);
      this.#offset += n;
    } finally {
      disposeAll(enc);
    }
    return this.codec.view(this.#fetch(), this.#offset);
  }

  #fetch(): MlxArray[] {
    const planes = this._planes!;
    if (this.#offset < this.capacity) return planes.map((p) => tokens(p, 0, this.#offset));
    return planes.map((p) => p.retain());
  }

  makeMask(n: number, window: number | null): Mask {
    return linearMask(n, this.#offset, window);
  }

  state(): CacheState {
    return makeState(this.signature(), this._planes && this.#offset ? this.#fetch() : [], { offset: this.#offset });
  }

  restoreState(state: CacheState): void {
    const want = this.codec.kPlanes + this.codec.vPlanes;
    if (state.signature !== this.signature()) fail(`KVCache.restoreState: state is ${state.signature}, this cache is ${this.signature()}`);
    const offset = state.meta.offset;
    if (offset === undefined || !Number.isInteger(offset) || offset < 0) fail("KVCache.restoreState: meta.offset missing or invalid");
    if (offset === 0 ? state.tensors.length !== 0 && state.tensors.length !== want : state.tensors.length !== want) {
      fail(`KVCache.restoreState: ${this.codec.name} needs ${want} tensors, got ${state.tensors.length}`);
    }
    for (const t of state.tensors) {
      if (t.ndim !== 4 || t.shape[2] !== offset) fail(`KVCache.restoreState: tensor ${t.describe()} does not hold ${offset} tokens as [B, H, T, x]`);
    }
    disposeAll(this._planes);
    this._planes = state.tensors.length ? [...state.tensors] : null;
    this.#offset = offset;
  }

  isTrimmable(): boolean {
    return true;
  }

  /** Any trim within the held tokens is exact. */
  canTrim(n: number): boolean {
    return Number.isInteger(n) && n >= 0 && n <= this.#offset;
  }

  trim(n: number): number {
    checkTrim("KVCache.trim", n, this.#offset);
    this.#offset -= n;
    return n;
  }

  signature(): string {
    return this.codec.name;
  }
}
