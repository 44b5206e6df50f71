// Reductions (mx.sum, ...).
import type { MlxArray, Stream } from "@mlx-bun/mlx-ffi";
import { type Axes, axesArg } from "./axes.ts";
import { bindOps, result, sh, sig } from "./native.ts";

const lib = bindOps({
  mlxb_sum: sig.reduce,
});

export interface ReduceOptions {
  keepdims?: boolean;
  stream?: Stream;
}

/** mx.sum over `axes` (all when omitted). */
export function sum(a: MlxArray, axes?: Axes, opts: ReduceOptions = {}): MlxArray {
  const [p, n] = axesArg("sum", axes);
  return result("sum", lib().mlxb_sum(a.handle, p, n, opts.keepdims ? 1 : 0, sh(opts.stream)), [a, `axes=${String(axes)}`]);
}
