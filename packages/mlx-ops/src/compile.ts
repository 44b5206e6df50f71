// mx.compile for functions written in TypeScript: MLX traces the function through a native
// callback, fuses the graph and replays it on later calls. Design: docs/compile.md.
import { FFIType, JSCallback, read, type Pointer } from "bun:ffi";
import { checkHandle, checkStatus, handleList, MlxArray, MlxError } from "@mlx-bun/mlx-ffi";
import { describeArgs, listLib, takeList } from "./list.ts";
import { bindOps } from "./native.ts";

const { ptr, i32, void: none } = FFIType;
const lib = bindOps({
  mlxb_compile_new: { args: [ptr, i32], returns: ptr },
  mlxb_compile_call: { args: [ptr, ptr, i32], returns: ptr },
  mlxb_compile_traces: { args: [ptr], returns: i32 },
  mlxb_compile_free: { args: [ptr], returns: none },
  mlxb_set_compile_mode: { args: [i32], returns: i32 },
});

// Safety net only, as for MlxArray: a compiled function never disposed frees its trace and
// callback when collected. The held value must not reference the function itself.
const registry = new FinalizationRegistry<{ handle: Pointer; cb: JSCallback }>(({ handle, cb }) => {
  lib().mlxb_compile_free(handle);
  cb.close();
});

export interface CompileOptions {
  /**
   * Trace once per input rank/dtype and reuse the graph for any shape (mx.compile's
   * `shapeless=True`); the function must not bake shapes in (e.g. reshape to fixed dims).
   */
  shapeless?: boolean;
}

/** A compiled function: call it like the original; dispose it to free the trace and its cache. */
export type CompiledFunction<A extends MlxArray[], R extends MlxArray | MlxArray[]> = ((...args: A) => R) &
  Disposable & {
    /** How many times MLX traced the function so far (cached calls do not trace). */
    readonly traces: number;
    dispose(): void;
  };

/**
 * mx.compile. `fn` is called only while MLX traces it, with placeholder arrays: it must build
 * its result from its arguments with mlx-ops calls (no eval, no reading values). Arrays it
 * closes over are baked into the trace as constants; pass anything that changes as an
 * argument. The arrays `fn` returns are taken over (disposed after tracing): return new
 * arrays, or `retain()` a captured one.
 */
export function compile<A extends MlxArray[], R extends MlxArray | MlxArray[]>(fn: (...args: A) => R, opts: CompileOptions = {}): CompiledFunction<A, R> {
  let thrown: { error: unknown } | undefined;
  let single: boolean | undefined;
  const trace = (inputs: Pointer | null, n: number, out: Pointer | null): number => {
    const args: MlxArray[] = [];
    try {
      // The trampoline made one fresh handle per placeholder: own them all before anything can throw.
      for (let i = 0; i < n; i++) args.push(MlxArray.fromHandle(read.ptr(inputs as Pointer, 8 * i) as Pointer, "compile"));
      const r = fn(...(args as A));
      const outs = r instanceof MlxArray ? [r] : r;
      if (!Array.isArray(outs) || outs.some((o) => !(o instanceof MlxArray))) {
        throw new MlxError("compile: the function must return an MlxArray or an array of MlxArrays");
      }
      single = r instanceof MlxArray;
      const l = listLib();
      try {
        for (const o of outs) checkStatus(l.mlxb_list_push(out, o.handle), "compile");
      } finally {
        for (const o of outs) o.dispose();
      }
      return 0;
    } catch (error) {
      // Exceptions must not unwind through native frames: keep it and rethrow after the call.
      thrown = { error };
      return 1;
    } finally {
      for (const a of args) a.dispose();
    }
  };
  const cb = new JSCallback(trace, { args: [ptr, i32, ptr], returns: i32 });
  let handle: Pointer | null = checkHandle(lib().mlxb_compile_new(cb.ptr, opts.shapeless ? 1 : 0), "compile");
  const live = (): Pointer => {
    if (handle === null) throw new MlxError("compiled function used after dispose()");
    return handle;
  };

  const call = (...args: A): R => {
    for (const a of args) if (!(a instanceof MlxArray)) throw new MlxError(`compile: arguments must be MlxArrays, got ${String(a)}`);
    thrown = undefined;
    const h = lib().mlxb_compile_call(live(), args.length ? handleList(args) : null, args.length);
    if (h === null && thrown) {
      const { error } = thrown;
      thrown = undefined;
      throw error;
    }
    const outs = takeList("compiled function", h, () => describeArgs(args));
    return (single === false ? outs : outs[0]) as R;
  };
  const dispose = (): void => {
    if (handle === null) return;
    registry.unregister(call);
    lib().mlxb_compile_free(handle);
    handle = null;
    cb.close();
  };
  registry.register(call, { handle, cb }, call);
  return Object.defineProperties(call, {
    traces: { get: () => checkStatus(lib().mlxb_compile_traces(live()), "compile.traces") },
    dispose: { value: dispose },
    [Symbol.dispose]: { value: dispose },
  }) as CompiledFunction<A, R>;
}

/** Turn MLX compilation off or on for this process (mx.disable_compile / mx.enable_compile). */
export function set_compile_enabled(enabled: boolean): void {
  checkStatus(lib().mlxb_set_compile_mode(enabled ? 3 : 0), "set_compile_mode");
}
