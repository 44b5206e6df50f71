// QuantizeAfterKVCache: a bf16 KVCache that turns into an affine-quantized one once it holds
// `start` tokens (mlx-lm's --kv-bits / --kv-group-size / --quantized-kv-start: generate_step calls
// maybe_quantize_kv_cache after every model call, which replaces a KVCache whose offset reached
// quantized_kv_start by KVCache.to_quantized(group_size, bits)).
import type { MlxArray } from "@mlx-bun/mlx-ffi";
import { AFFINE_BITS, AFFINE_GROUPS, affineCodec } from "./affine.ts";
import { plainCodec } from "./codec.ts";
import { convert } from "./convert.ts";
import { KVCache, makeState } from "./growable.ts";
import { type Cache, type CacheState, type KvView, type Mask, fail } from "./types.ts";

/**
 * Starts as a plain KVCache; right after the update that brings its offset to `start` or past it
 * (the point where mlx-lm converts, after the model call), the cache is converted in place to the
 * affine codec (`toAffine`: same planes as mlx-lm's QuantizedKVCache). The attention of that
 * update still reads the bf16 planes, as mlx-lm's does. Prefixes shorter than the conversion
 * point are not reusable afterwards (minimumReusableOffset).
 *
 * The signature names the whole policy (`kv:plain>quant:<bits>:<group>@<start>`), so it does not
 * change at the conversion. State slots: the plain planes (keys, values) before the conversion,
 * the affine planes after (k.w, k.scales, k.biases, v.w, v.scales, v.biases); meta { offset,
 * quantized: 0 | 1 }.
 */
export class QuantizeAfterKVCache implements Cache {
  #inner: KVCache;

  constructor(
    readonly start: number,
    readonly bits: number,
    readonly groupSize: number,
  ) {
    if (!Number.isInteger(start) || start < 0) fail(`QuantizeAfterKVCache: start must be a non-negative integer, got ${start}`);
    if (!(AFFINE_BITS as readonly number[]).includes(bits)) fail(`QuantizeAfterKVCache: bits must be one of ${AFFINE_BITS.join(", ")}, got ${bits}`);
    if (!(AFFINE_GROUPS as readonly number[]).includes(groupSize))
      fail(`QuantizeAfterKVCache: group size must be one of ${AFFINE_GROUPS.join(", ")}, got ${groupSize}`);
    this.#inner = new KVCache(plainCodec);
  }

  /** Whether the conversion has happened. */
  get quantized(): boolean {
    return this.#inner.codec !== plainCodec;
  }

  /** The codec the planes are stored in now. */
  get codec() {
    return this.#inner.codec;
  }

  get offset(): number {
    return this.#inner.offset;
  }

  get minimumReusableOffset(): number {
    return this.#inner.minimumReusableOffset;
  }

  set minimumReusableOffset(n: number) {
    this.#inner.minimumReusableOffset = n;
  }

  get nbytes(): number {
    return this.#inner.nbytes;
  }

  updateAndFetch(k: MlxArray, v: MlxArray): KvView {
    const view = this.#inner.updateAndFetch(k, v);
    try {
      this.#maybeConvert();
    } catch (e) {
      view.dispose();
      throw e;
    }
    return view;
  }

  #maybeConvert(): void {
    if (this.quantized || this.#inner.offset < this.start || this.#inner.offset === 0) return;
    this.#inner = convert(this.#inner, affineCodec(this.bits, this.groupSize), "QuantizeAfterKVCache");
  }

  makeMask(n: number, window: number | null): Mask {
    return this.#inner.makeMask(n, window);
  }

  state(): CacheState {
    const s = this.#inner.state();
    const tensors = [...s.tensors];
    const meta = { ...s.meta, quantized: this.quantized ? 1 : 0 };
    return makeState(this.signature(), tensors, meta);
  }

  restoreState(state: CacheState): void {
    if (state.signature !== this.signature()) fail(`QuantizeAfterKVCache.restoreState: state is ${state.signature}, this cache is ${this.signature()}`);
    const q = state.meta.quantized;
    if (q !== 0 && q !== 1) fail("QuantizeAfterKVCache.restoreState: meta.quantized must be 0 or 1");
    const inner = new KVCache(q === 1 ? affineCodec(this.bits, this.groupSize) : plainCodec);
    inner.restoreState(makeState(inner.signature(), state.tensors, { offset: state.meta.offset ?? Number.NaN }));
    inner.minimumReusableOffset = this.#inner.minimumReusableOffset;
    this.#inner.dispose();
    this.#inner = inner;
  }

  isTrimmable(): boolean {
    return this.#inner.isTrimmable();
  }

  canTrim(n: number): boolean {
    return this.#inner.canTrim(n);
  }

  trim(n: number): number {
    return this.#inner.trim(n);
  }

  signature(): string {
    return `kv:plain>quant:${this.bits}:${this.groupSize}@${this.start}`;
  }

  bytesPerToken(): number {
    return this.#inner.bytesPerToken();
  }

  dispose(): void {
    this.#inner.dispose();
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}
