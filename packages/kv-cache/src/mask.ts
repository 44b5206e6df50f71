// Causal masks, as mlx-lm's create_causal_mask (models/base.py) builds them.
import type { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";

/**
 * Boolean mask [n, offset + n]: query i (at position offset + i) sees key j when
 * j <= offset + i and, with a window, offset + i < j + window.
 * Same ops in the same order as mlx-lm, so the bits match.
 */
export function createCausalMask(n: number, offset = 0, window: number | null = null): MlxArray {
  using rinds = mx.arange(offset + n);
  using linds0 = offset ? mx.arange(offset, offset + n) : rinds.retain();
  using linds = mx.expand_dims(linds0, 1);
  using r = mx.expand_dims(rinds, 0);
  const mask = mx.greater_equal(linds, r);
  if (window === null) return mask;
  using m = mask;
  using rw = mx.add(r, window);
  using inWindow = mx.less(linds, rw);
  return mx.logical_and(m, inWindow);
}

/**
 * The mask rule of a non-rotating cache: one token needs none; windowless
 * chunks use "causal" at any offset (fast SDPA aligns it bottom-right, the same
 * values as the materialized matrix); a windowed chunk is "causal" only when
 * the whole chunk fits the window from position 0, else an array.
 */
export function linearMask(n: number, offset: number, window: number | null): "causal" | MlxArray | null {
  if (window === null) return n === 1 ? null : "causal";
  if (offset === 0 && n <= window) return n === 1 ? null : "causal";
  return createCausalMask(n, offset, window);
}
