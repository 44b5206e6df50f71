// Array lists returned by native ops with several outputs (quantize, compiled functions, kernels).
import { FFIType, type Pointer } from "bun:ffi";
import { checkHandle, MlxArray } from "@mlx-bun/mlx-ffi";
import { bindOps } from "./native.ts";

const { ptr, i32, void: none } = FFIType;
export const listLib = bindOps({
  mlxb_list_new: { args: [], returns: ptr },
  mlxb_list_size: { args: [ptr], returns: i32 },
  mlxb_list_get: { args: [ptr, i32], returns: ptr },
  mlxb_list_push: { args: [ptr, ptr], returns: i32 },
  mlxb_list_free: { args: [ptr], returns: none },
});

/**
 * Take a native list handle (or throw the op's error for a null one): one MlxArray per element,
 * then free the list.
 */
export function takeList(op: string, h: Pointer | bigint | null, context: () => string): MlxArray[] {
  const l = checkHandle(h, op, context);
  const lib = listLib();
  try {
    const n = lib.mlxb_list_size(l);
    const out: MlxArray[] = [];
    for (let i = 0; i < n; i++) out.push(MlxArray.fromHandle(lib.mlxb_list_get(l, i), op));
    return out;
  } finally {
    lib.mlxb_list_free(l);
  }
}

/** Describe op inputs for error messages: arrays by shape/dtype, the rest as strings. */
export function describeArgs(args: readonly unknown[]): string {
  return args
    .filter((x) => x !== undefined)
    .map((x) => (x instanceof MlxArray ? x.describe() : String(x)))
    .join(", ");
}
