// Elementwise ops (mx.add, mx.exp, mx.astype, ...).
import { FFIType } from "bun:ffi";
import { type Dtype, dtypeCode, type MlxArray, type Stream } from "@mlx-bun/mlx-ffi";
import { bindOps, result, sh, sig } from "./native.ts";
import { type ArrayOrScalar, withOperands } from "./scalar.ts";

const lib = bindOps({
  mlxb_add: sig.binary,
  mlxb_subtract: sig.binary,
  mlxb_multiply: sig.binary,
  mlxb_divide: sig.binary,
  mlxb_exp: sig.unary,
  mlxb_astype: { args: [FFIType.ptr, FFIType.i32, FFIType.ptr], returns: FFIType.ptr },
});

type BinarySym = "mlxb_add" | "mlxb_subtract" | "mlxb_multiply" | "mlxb_divide";
function binary(sym: BinarySym, name: string) {
  return (a: ArrayOrScalar, b: ArrayOrScalar, s?: Stream): MlxArray =>
    withOperands(a, b, (x, y) => result(name, lib()[sym](x.handle, y.handle, sh(s)), [x, y]));
}

/** mx.add with broadcasting; JS numbers are weakly typed. */
export const add = binary("mlxb_add", "add");
export const subtract = binary("mlxb_subtract", "subtract");
export const multiply = binary("mlxb_multiply", "multiply");
export const divide = binary("mlxb_divide", "divide");

export function exp(a: MlxArray, s?: Stream): MlxArray {
  return result("exp", lib().mlxb_exp(a.handle, sh(s)), [a]);
}

/** mx.astype */
export function astype(a: MlxArray, dtype: Dtype, s?: Stream): MlxArray {
  return result("astype", lib().mlxb_astype(a.handle, dtypeCode(dtype), sh(s)), [a, dtype]);
}
