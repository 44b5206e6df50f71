// Evaluation, devices and streams, memory statistics, version.
import type { Pointer } from "bun:ffi";
import { handleList, type MlxArray } from "./array.ts";
import { checkHandle, checkStatus, cstr, lib } from "./library.ts";

/** Evaluate many arrays in one native call. */
export function evaluate(...arrays: MlxArray[]): void {
  if (arrays.length === 0) return;
  checkStatus(lib().mlxb_eval(handleList(arrays), arrays.length), "eval", () => arrays.map((a) => a.describe()).join(", "));
}

/** Schedule evaluation and return at once; read the arrays (or `waitFor`) to join. */
export function asyncEval(...arrays: MlxArray[]): void {
  if (arrays.length === 0) return;
  checkStatus(lib().mlxb_async_eval(handleList(arrays), arrays.length), "async_eval", () => arrays.map((a) => a.describe()).join(", "));
}

/**
 * Make streams usable from any thread this thread's defaults (MLX 0.32 ties an ordinary stream's
 * command encoder to the thread that made it) and start the background evaluator. Done when the
 * library loads; call again to restore them after setting other default streams (arrays built on
 * those cannot be evaluated by `asyncEvalInBackground`). Idempotent.
 */
export function useSharedStreams(): void {
  checkStatus(lib().mlxb_use_shared_streams(), "use_shared_streams");
}

/**
 * `asyncEval` on a native worker thread: returns as soon as the job is handed over, so the caller
 * can build the next step while MLX encodes this one. `reads` (optional, size 1 each): arrays the
 * worker reads right after scheduling (a decode loop passes the previous step's tokens, inputs of
 * this step's graph that must not be read from this thread meanwhile); `BackgroundJob.values()`
 * returns them. Any call that evaluates, waits or reads data joins the worker first, and an error
 * of the background job is raised there. See docs/background-eval.md.
 */
export function asyncEvalInBackground(arrays: readonly MlxArray[], reads: readonly MlxArray[] = []): BackgroundJob {
  const id = Number(lib().mlxb_async_eval_background(handleList(arrays), arrays.length, handleList(reads), reads.length));
  if (id < 0) checkStatus(-1, "async_eval_background", () => arrays.map((a) => a.describe()).join(", "));
  return new BackgroundJob(id, reads.length);
}

/** A job handed to the background evaluator. */
export class BackgroundJob {
  constructor(
    readonly id: number,
    readonly reads: number,
  ) {}
  /** The values of the job's `reads` (joining the worker first). */
  values(): number[] {
    const out = new Float64Array(Math.max(1, this.reads));
    checkStatus(lib().mlxb_background_values(this.id, out, this.reads), "background_values", () => `job ${this.id}`);
    return Array.from(out.subarray(0, this.reads));
  }
}

/** Wait until the background evaluator has handed its job to MLX (not until it is computed). */
export function joinBackground(): void {
  checkStatus(lib().mlxb_join_background(), "join_background");
}

/** Write the unevaluated graph behind `arrays` to `path` as Graphviz text (mx.export_to_dot). */
export function exportToDot(path: string, ...arrays: MlxArray[]): void {
  checkStatus(lib().mlxb_export_to_dot(cstr(path), handleList(arrays), arrays.length), "export_to_dot", () => path);
}

/** True when the array's data has been computed. */
export function isAvailable(a: MlxArray): boolean {
  return checkStatus(lib().mlxb_array_is_available(a.handle), "is_available") === 1;
}

/** Block until an array scheduled by `asyncEval` is computed. */
export function waitFor(a: MlxArray): void {
  checkStatus(lib().mlxb_array_wait(a.handle), "wait", () => a.describe());
}

export type DeviceType = "cpu" | "gpu";
const deviceCode = (d: DeviceType): number => (d === "gpu" ? 1 : 0);

/** Whether this MLX build has the device (gpu: Metal or CUDA). */
export function isDeviceAvailable(d: DeviceType): boolean {
  return checkStatus(lib().mlxb_device_is_available(deviceCode(d)), "is_available") === 1;
}

export function defaultDevice(): DeviceType {
  return checkStatus(lib().mlxb_default_device_type(), "default_device") === 1 ? "gpu" : "cpu";
}

/** Set the process default device; throws if the build does not have it. */
export function setDefaultDevice(d: DeviceType, index = 0): void {
  checkStatus(lib().mlxb_set_default_device(deviceCode(d), index), "set_default_device", () => d);
}

/** An MLX stream handle. `Stream.default(d)` or `Stream.create(d)`; pass to ops, or omit for the default. */
export class Stream implements Disposable {
  #handle: Pointer | null;
  private constructor(h: Pointer) {
    this.#handle = h;
  }
  static default(d: DeviceType = defaultDevice()): Stream {
    return new Stream(checkHandle(lib().mlxb_default_stream(deviceCode(d)), "default_stream", () => d));
  }
  static create(d: DeviceType = defaultDevice()): Stream {
    return new Stream(checkHandle(lib().mlxb_new_stream(deviceCode(d)), "new_stream", () => d));
  }
  get handle(): Pointer {
    if (this.#handle === null) throw new Error("Stream used after dispose()");
    return this.#handle;
  }
  get index(): number {
    return checkStatus(lib().mlxb_stream_index(this.handle), "stream.index");
  }
  get device(): DeviceType {
    return checkStatus(lib().mlxb_stream_device_type(this.handle), "stream.device") === 1 ? "gpu" : "cpu";
  }
  /** Wait for everything queued on this stream. */
  synchronize(): void {
    checkStatus(lib().mlxb_synchronize(this.handle), "synchronize");
  }
  dispose(): void {
    if (this.#handle !== null) lib().mlxb_stream_free(this.#handle);
    this.#handle = null;
  }
  [Symbol.dispose](): void {
    this.dispose();
  }
  toString(): string {
    return `Stream(${this.device}, ${this.index})`;
  }
}

/** Make `s` the default stream of its device: ops given no stream run on it. */
export function setDefaultStream(s: Stream): void {
  checkStatus(lib().mlxb_set_default_stream(s.handle), "set_default_stream", () => String(s));
}

/**
 * Run `fn` (synchronous) with `s` as its device's default stream, as Python's `with mx.stream(s)`;
 * the previous default is restored after, also when `fn` throws.
 */
export function withStream<T>(s: Stream, fn: () => T): T {
  using prev = Stream.default(s.device);
  setDefaultStream(s);
  try {
    return fn();
  } finally {
    setDefaultStream(prev);
  }
}

/** Wait for all streams. */
export function synchronize(): void {
  checkStatus(lib().mlxb_synchronize(null), "synchronize");
}

/** MLX allocator statistics and limits (bytes), as `mx.get_active_memory()` and friends. */
export const memory = {
  active: (): number => checkStatus(lib().mlxb_active_memory(), "get_active_memory"),
  peak: (): number => checkStatus(lib().mlxb_peak_memory(), "get_peak_memory"),
  cache: (): number => checkStatus(lib().mlxb_cache_memory(), "get_cache_memory"),
  limit: (): number => checkStatus(lib().mlxb_memory_limit(), "get_memory_limit"),
  resetPeak: (): void => void checkStatus(lib().mlxb_reset_peak_memory(), "reset_peak_memory"),
  /** Returns the previous limit. */
  setLimit: (bytes: number): number => checkStatus(lib().mlxb_set_memory_limit(bytes), "set_memory_limit"),
  /** Returns the previous limit. */
  setCacheLimit: (bytes: number): number => checkStatus(lib().mlxb_set_cache_limit(bytes), "set_cache_limit"),
  clearCache: (): void => void checkStatus(lib().mlxb_clear_cache(), "clear_cache"),
  /** Native array handles alive right now (a leak detector for tests). */
  liveHandles: (): number => lib().mlxb_live_handles(),
};

/** The MLX version the native library was built against, e.g. "0.32.4". */
export function mlxVersion(): string {
  return String(lib().mlxb_mlx_version());
}
