// Token-axis helpers over cache planes: every stored tensor is [B, H, T, x] with tokens on axis 2.
import type { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";

/** p[..., start:stop, :] */
export function tokens(p: MlxArray, start: number, stop: number): MlxArray {
  const [b, h, , x] = p.shape as [number, number, number, number];
  return mx.slice(p, [0, 0, start, 0], [b, h, stop, x]);
}

/** p with p[..., start:start+L, :] = update (a new array; p is not changed). */
export function writeTokens(p: MlxArray, update: MlxArray, start: number): MlxArray {
  const [b, h, , x] = p.shape as [number, number, number, number];
  return mx.slice_update(p, update, [0, 0, start, 0], [b, h, start + update.shape[2]!, x]);
}

/** zeros [B, H, t, x] in the dtype and trailing dim of `like`. */
export function zerosTokens(like: MlxArray, t: number): MlxArray {
  const [b, h, , x] = like.shape as [number, number, number, number];
  return mx.zeros([b, h, t, x], like.dtype);
}

/** concatenate along the token axis. */
export function catTokens(parts: readonly MlxArray[]): MlxArray {
  return mx.concatenate(parts, 2);
}

/** Replace each array of `list` by fn(old), disposing the old ones. */
export function replaceAll(list: MlxArray[], fn: (p: MlxArray, i: number) => MlxArray): void {
  for (let i = 0; i < list.length; i++) {
    const old = list[i]!;
    list[i] = fn(old, i);
    old.dispose();
  }
}

export function disposeAll(list: readonly (MlxArray | undefined)[] | null | undefined): void {
  if (list) for (const a of list) a?.dispose();
}

/** Bytes one token costs across planes: B · H · x · itemsize summed. */
export function planeBytesPerToken(planes: readonly MlxArray[]): number {
  let n = 0;
  for (const p of planes) n += p.shape[0]! * p.shape[1]! * p.shape[3]! * p.itemsize;
  return n;
}

/**
 * What every layout has from its planes alone: bytes, the borrowed planes, disposal. The
 * layouts (KVCache, RotatingKVCache and their batched forms) differ only in how tokens move.
 */
export abstract class PlaneLayout implements Disposable {
  protected _planes: MlxArray[] | null = null;

  /** Bytes one more token costs (0 before the first update). */
  bytesPerToken(): number {
    return this._planes ? planeBytesPerToken(this._planes) : 0;
  }

  get nbytes(): number {
    return this._planes ? this._planes.reduce((a, p) => a + p.nbytes, 0) : 0;
  }

  /** The stored planes (borrowed), for conversions and tests. */
  get planes(): readonly MlxArray[] | null {
    return this._planes;
  }

  dispose(): void {
    disposeAll(this._planes);
    this._planes = null;
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}

/** Append `size` zero tokens to every plane, or start planes of `size` zero tokens shaped like `enc`. */
export function growTokens(planes: MlxArray[] | null, enc: readonly MlxArray[], size: number): MlxArray[] {
  if (!planes) return enc.map((e) => zerosTokens(e, size));
  replaceAll(planes, (p) => {
    using z = zerosTokens(p, size);
    return catTokens([p, z]);
  });
  return planes;
}

/**
 * mlx-lm's KVCache growth and write, over planes: when `prev + L` passes the capacity, trim to
 * `prev` if it is not a multiple of `step`, then append zeros for ceil(L / step) steps; then
 * write the encoded chunk at `prev` with slice_update. Returns the planes (replaced in place).
 */
export function appendGrowing(planes: MlxArray[] | null, enc: readonly MlxArray[], prev: number, step: number): MlxArray[] {
  const n = enc[0]!.shape[2]!;
  if (!planes || prev + n > planes[0]!.shape[2]!) {
    if (planes && prev % step !== 0) replaceAll(planes, (p) => tokens(p, 0, prev));
    planes = growTokens(planes, enc, Math.ceil(n / step) * step);
  }
  replaceAll(planes, (p, i) => writeTokens(p, enc[i]!, prev));
  return planes;
}
