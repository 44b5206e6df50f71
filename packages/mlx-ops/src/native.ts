// Binding op symbols of the native library, and the call wrapper that turns a failure into an error naming op, shapes and dtypes.
import { FFIType, type Pointer } from "bun:ffi";
import { checkHandle, MlxArray, openLibrary, type Stream } from "@mlx-bun/mlx-ffi";

const { ptr, i32 } = FFIType;
export type Sym = { args: readonly FFIType[]; returns: FFIType };

/** Common signatures. */
export const sig = {
  /** (a, stream) -> array */
  unary: { args: [ptr, ptr], returns: ptr },
  /** (a, b, stream) -> array */
  binary: { args: [ptr, ptr, ptr], returns: ptr },
  /** (a, axes*, naxes, keepdims, stream) -> array; naxes < 0 = all axes */
  reduce: { args: [ptr, ptr, i32, i32, ptr], returns: ptr },
} as const satisfies Record<string, Sym>;

/**
 * Bind a table of op symbols; each op module binds its own. The library is
 * opened on first use (one dlopen per table; the OS shares the loaded image).
 */
export function bindOps<S extends Record<string, Sym>>(symbols: S): () => ReturnType<typeof openLibrary<S>> {
  let opened: ReturnType<typeof openLibrary<S>> | undefined;
  return () => (opened ??= openLibrary(symbols));
}

/** Stream argument of an op: a Stream, or null for the default stream. */
export function sh(s: Stream | undefined): Pointer | null {
  return s ? s.handle : null;
}

/** An argument of an error context, formatted only when the op fails: arrays by shape, lists as "[2, 3]", thunks called. */
function describeArg(x: unknown): string {
  if (x instanceof MlxArray) return x.describe();
  if (typeof x === "function") return String(x());
  if (Array.isArray(x)) return `[${x.map(String).join(", ")}]`;
  return String(x);
}

/**
 * Wrap the handle an op returned. On failure the error reads
 * `op(array(shape=[2, 3], dtype=float32), ...): <MLX message>`. Callers pass raw lists and thunks,
 * not formatted strings: the context is built on every call and read only on failure.
 */
export function result(op: string, h: Pointer | bigint | null, inputs: readonly unknown[]): MlxArray {
  return MlxArray.fromHandle(
    checkHandle(h, op, () => inputs.map(describeArg).join(", ")),
    op,
  );
}
