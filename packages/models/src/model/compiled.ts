// The helpers gemma4_text.py wraps in mx.compile(shapeless=True): geglu and logit_softcap. The
// same ops under compile give the same graph as mlx-lm (one fused Compiled node on GPUs instead
// of a kernel per elementwise op), which is what keeps CUDA decode fast and bit-equal to mlx-lm.
// They live for the process, like mlx-lm's module-level compiled functions.
import type { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";

type Binary = mx.CompiledFunction<[MlxArray, MlxArray], MlxArray>;
type Unary = mx.CompiledFunction<[MlxArray], MlxArray>;

let gegluFn: Binary | undefined;
const softcapFns = new Map<number, Unary>();

/** `gelu_approx(gate) * x`, compiled (gemma4_text.py geglu). */
export function geglu(gate: MlxArray, x: MlxArray): MlxArray {
  gegluFn ??= mx.compile(
    (g: MlxArray, v: MlxArray) => {
      using a = mx.gelu_approx(g);
      return mx.multiply(a, v);
    },
    { shapeless: true },
  );
  return gegluFn(gate, x);
}

/** `tanh(x / softcap) * softcap`, compiled; one trace per soft-cap value, as mlx-lm's constant argument. */
export function logitSoftcap(softcap: number, x: MlxArray): MlxArray {
  let fn = softcapFns.get(softcap);
  if (!fn) {
    fn = mx.compile(
      (y: MlxArray) => {
        using d = mx.divide(y, softcap);
        using t = mx.tanh(d);
        return mx.multiply(t, softcap);
      },
      { shapeless: true },
    );
    softcapFns.set(softcap, fn);
  }
  return fn(x);
}
