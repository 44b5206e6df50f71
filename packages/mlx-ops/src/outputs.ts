// Ops with several results: the native side writes handles into a buffer we pass and returns
// their count. We read the slots back with bun:ffi `read.ptr` from the buffer's address, never
// through the TypedArray itself (JIT-compiled loads after an FFI call can be stale: oven-sh/bun#32054).
import { ptr, read, type Pointer } from "bun:ffi";
import { checkStatus, MlxArray } from "@mlx-bun/mlx-ffi";

/** A buffer of `n` handle slots for a native call. */
export function handleSlots(n: number): BigUint64Array {
  return new BigUint64Array(Math.max(n, 1));
}

/** Own the `count` handles the native call wrote into `slots` (status < 0 throws the op's error). */
export function takeHandles(op: string, slots: BigUint64Array, count: number, context: () => string): MlxArray[] {
  const n = checkStatus(count, op, context);
  const base = ptr(slots);
  const out: MlxArray[] = [];
  // Own every handle first, so none leaks if a later one were bad.
  for (let i = 0; i < n; i++) out.push(MlxArray.fromHandle(read.ptr(base, 8 * i) as Pointer, op));
  return out;
}
