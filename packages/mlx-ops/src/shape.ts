// Shape and indexing ops (mx.reshape, ...).
import { FFIType } from "bun:ffi";
import { checkShape, type MlxArray, type Stream } from "@mlx-bun/mlx-ffi";
import { bindOps, result, sh } from "./native.ts";

const { ptr, i32 } = FFIType;
const lib = bindOps({
  mlxb_reshape: { args: [ptr, ptr, i32, ptr], returns: ptr },
});

/** mx.reshape; one dimension may be -1. */
export function reshape(a: MlxArray, shape: readonly number[], s?: Stream): MlxArray {
  if (shape.some((d) => !Number.isInteger(d) || d < -1)) checkShape(shape, "reshape");
  const dims = Int32Array.from(shape);
  return result("reshape", lib().mlxb_reshape(a.handle, dims.length ? dims : null, dims.length, sh(s)), [a, `[${shape.join(", ")}]`]);
}
