// Custom kernels: one reference composition of plain ops (runs everywhere, the CPU backend
// included) plus per-backend sources (Metal via mx::fast::metal_kernel, CUDA via
// mx::fast::cuda_kernel). A source runs only where its backend is live; the choice is the
// explicit, pure function `select_kernel_path`, so it can be tested on any machine.
import { FFIType, type Pointer } from "bun:ffi";
import {
  checkHandle,
  checkStatus,
  cstr,
  defaultDevice,
  type DeviceType,
  type Dtype,
  dtypeCode,
  handleList,
  isDtype,
  type MlxArray,
  MlxError,
  type Stream,
} from "@mlx-bun/mlx-ffi";
import { describeArgs, takeList } from "../list.ts";
import { bindOps, sh } from "../native.ts";

const { ptr, i32, f64, void: none } = FFIType;
const lib = bindOps({
  mlxb_gpu_backend: { args: [], returns: i32 },
  mlxb_kernel_new: { args: [i32, ptr, ptr, ptr, ptr, ptr, i32, i32, i32], returns: ptr },
  mlxb_kernel_free: { args: [ptr], returns: none },
  mlxb_kernel_set_direct: { args: [i32], returns: none },
  mlxb_kernel_direct_enabled: { args: [], returns: i32 },
  mlxb_kernel_direct_launches: { args: [], returns: f64 },
  mlxb_kernel_call: {
    args: [ptr, ptr, i32, ptr, ptr, ptr, i32, ptr, ptr, ptr, ptr, ptr, i32, i32, f64, i32, ptr],
    returns: ptr,
  },
});

/** GPU backends a kernel can have a source for. */
export type GpuBackend = "metal" | "cuda";
/** What runs a kernel call: its reference composition or one of its sources. */
export type KernelPath = "reference" | GpuBackend;
/** A template argument: a JS integer (int), a boolean (bool) or a dtype name (a type). */
export type TemplateArg = number | boolean | Dtype;

export interface KernelSource {
  /** The kernel body; MLX generates the signature from the input/output names. */
  source: string;
  /** Code placed before the kernel (helpers, includes). */
  header?: string;
}

/** How to launch a source for given inputs (the same for Metal and CUDA in MLX's API). */
export interface KernelLaunch {
  output_shapes: readonly (readonly number[])[];
  output_dtypes: readonly Dtype[];
  /** Threads in total per axis (MLX rounds up to whole threadgroups on CUDA: bounds-check there). */
  grid: readonly [number, number, number];
  threadgroup: readonly [number, number, number];
  template?: readonly (readonly [string, TemplateArg])[];
  /** Fill outputs with this value before the kernel runs. */
  init_value?: number;
}

export interface KernelSpec {
  name: string;
  input_names: readonly string[];
  output_names: readonly string[];
  metal?: KernelSource & { atomic_outputs?: boolean };
  /**
   * `direct`: launches may skip MLX's per-launch work (docs/custom-kernels.md, "Direct launch"); set
   * only for sources checked bit for bit against MLX's path on a GPU (tools/bench/device/direct-launch-check.ts).
   */
  cuda?: KernelSource & { shared_memory?: number; direct?: boolean };
  /** Copy inputs to row-contiguous layout first (default true; the sources may then index flat). */
  ensure_row_contiguous?: boolean;
  /** The reference composition of plain ops; a source must agree with it (tested per backend). */
  reference: (inputs: readonly MlxArray[], stream?: Stream) => MlxArray[];
  launch: (inputs: readonly MlxArray[]) => KernelLaunch;
  /**
   * Check inputs before any path runs, returning a message or null. A source fails on a GPU
   * worker thread where nothing can catch it, so bad inputs must be refused here.
   */
  validate?: (inputs: readonly MlxArray[]) => string | null;
}

/** A launch marshalled once for `CustomKernel.runPrepared` (see `prepare`). */
export interface PreparedLaunch {
  readonly n_out: number;
  readonly dims: Int32Array | null;
  readonly ndims: Int32Array;
  readonly dtypes: Int32Array;
  readonly grid: Int32Array;
  readonly threadgroup: Int32Array;
  readonly names: Buffer | null;
  readonly kinds: Int32Array | null;
  readonly values: Int32Array | null;
  readonly n_tmpl: number;
  readonly init: number | undefined;
}

/** What `select_kernel_path` decides from. */
export interface KernelEnvironment {
  /** The GPU backend of this MLX build on this machine, if any. */
  gpu_backend: GpuBackend | null;
  /** The device the call's stream (or the default stream) runs on. */
  device: DeviceType;
  /** From MLX_BUN_KERNELS=reference: run references only (debugging, bisecting). */
  reference_only?: boolean;
}

/** A process-wide on/off choice of a kernel path: `set` wins, else its environment variable (1|on, 0|off, unset: off) read once. */
export class KernelSwitch {
  #set: boolean | undefined;
  #env: boolean | undefined;
  constructor(readonly envName: string) {}

  /** Choose for this process; undefined goes back to the environment variable. */
  set(on: boolean | undefined): void {
    this.#set = on;
    this.#env = undefined;
  }

  get(): boolean {
    if (this.#set !== undefined) return this.#set;
    if (this.#env === undefined) {
      const v = process.env[this.envName];
      if (v === undefined || v === "" || v === "0" || v === "off") this.#env = false;
      else if (v === "1" || v === "on") this.#env = true;
      else throw new Error(`${this.envName}=${v}: expected 0, 1, on or off`);
    }
    return this.#env;
  }
}

/**
 * Direct CUDA launches (docs/custom-kernels.md, "Direct launch"): launches made from now on of the
 * kernels whose CUDA source allows it (`cuda.direct`) compile MLX's generated source once and add
 * their kernel node to MLX's command encoder without MLX's per-launch work. true / false for this
 * process; undefined goes back to MLX_BUN_DIRECT_LAUNCH=1|0 (default on). Only where MLX's CUDA
 * backend is loaded.
 */
export function set_direct_launch(on: boolean | undefined): void {
  if (on === undefined) checkDirectEnv();
  lib().mlxb_kernel_set_direct(on === undefined ? -1 : on ? 1 : 0);
}

/** The native side reads MLX_BUN_DIRECT_LAUNCH itself; a value it would not understand is refused here. */
function checkDirectEnv(): void {
  const v = process.env.MLX_BUN_DIRECT_LAUNCH;
  if (v !== undefined && !["", "0", "1", "on", "off"].includes(v)) throw new MlxError(`MLX_BUN_DIRECT_LAUNCH=${v}: expected 0, 1, on or off`);
}

/** Whether custom kernel launches made now go direct (the setting, MLX_BUN_DIRECT_LAUNCH and a CUDA build). */
export function direct_launch_enabled(): boolean {
  checkDirectEnv();
  return checkStatus(lib().mlxb_kernel_direct_enabled(), "direct_launch_enabled") === 1;
}

/** Kernels this process has launched directly so far (evaluated, not only built). */
export function direct_launches(): number {
  return lib().mlxb_kernel_direct_launches();
}

let backendCache: GpuBackend | null | undefined;

/** The live GPU backend: Metal (macOS), CUDA (Linux + mlx-cuda), or null (CPU-only build). */
export function gpu_backend(): GpuBackend | null {
  if (backendCache === undefined) {
    const code = checkStatus(lib().mlxb_gpu_backend(), "gpu_backend");
    backendCache = code === 1 ? "metal" : code === 2 ? "cuda" : null;
  }
  return backendCache;
}

/** The environment a call on `stream` (default: the default device's stream) would run in. */
export function kernel_environment(stream?: Stream): KernelEnvironment {
  return {
    gpu_backend: gpu_backend(),
    device: stream ? stream.device : defaultDevice(),
    reference_only: process.env.MLX_BUN_KERNELS === "reference",
  };
}

/**
 * Which path runs. "auto": the source of the live backend when the call runs on the GPU and
 * the kernel has that source; otherwise the reference. Asking for a backend explicitly throws
 * when it cannot run here (rather than silently running something else).
 */
export function select_kernel_path(
  spec: Pick<KernelSpec, "name" | "metal" | "cuda">,
  env: KernelEnvironment,
  request: "auto" | KernelPath = "auto",
): KernelPath {
  if (request === "reference") return "reference";
  if (request === "auto") {
    if (env.reference_only || env.device !== "gpu" || env.gpu_backend === null) return "reference";
    return spec[env.gpu_backend] ? env.gpu_backend : "reference";
  }
  if (!spec[request]) throw new MlxError(`kernel ${spec.name}: has no ${request} source`);
  if (env.gpu_backend !== request) {
    throw new MlxError(`kernel ${spec.name}: the ${request} backend is not live here (GPU backend: ${env.gpu_backend ?? "none"})`);
  }
  if (env.device !== "gpu") throw new MlxError(`kernel ${spec.name}: the ${request} source needs a GPU stream, not ${env.device}`);
  return request;
}

export interface KernelRunOptions {
  stream?: Stream;
  path?: "auto" | KernelPath;
  /** Print the generated source (MLX's verbose flag). */
  verbose?: boolean;
  /**
   * Decide the path as if in this environment instead of the live one (tests and tools: it
   * lets a CPU-only machine drive a source path down to MLX, which then refuses it).
   */
  environment?: KernelEnvironment;
}

function joinNames(op: string, names: readonly string[]): Buffer {
  for (const n of names) if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(n)) throw new MlxError(`${op}: '${n}' is not an identifier`);
  return cstr(names.join("\n"));
}

/** A `runKeyed` key from every input's shape and dtype: complete for kernels whose launch reads nothing else. */
export function inputsKey(inputs: readonly MlxArray[]): string {
  return inputs.map((a) => `${a.shape.join(",")}:${a.dtype}`).join("|");
}

/** Launch classes a kernel keeps prepared for `runKeyed` (cleared when full: keys come from shapes, few per process). */
const MAX_KEYED_LAUNCHES = 256;

/** A declared kernel: `run` picks the path; the native kernel objects are made on first use. */
export class CustomKernel implements Disposable {
  readonly spec: KernelSpec;
  #native = new Map<GpuBackend, Pointer>();
  #keyed = new Map<string, PreparedLaunch>();

  constructor(spec: KernelSpec) {
    if (!spec.output_names.length) throw new MlxError(`kernel ${spec.name}: needs at least one output`);
    this.spec = spec;
  }

  get name(): string {
    return this.spec.name;
  }

  /** The path a call on `stream` would take. */
  path(stream?: Stream, request: "auto" | KernelPath = "auto"): KernelPath {
    return select_kernel_path(this.spec, kernel_environment(stream), request);
  }

  run(inputs: readonly MlxArray[], opts: KernelRunOptions = {}): MlxArray[] {
    this.#check(inputs);
    const env = opts.environment ?? kernel_environment(opts.stream);
    const path = select_kernel_path(this.spec, env, opts.path);
    if (path === "reference") return this.spec.reference(inputs, opts.stream);
    return this.#launch(path, inputs, opts);
  }

  /**
   * `run` on the path chosen for `stream`, for a caller that names the launch class of its
   * inputs: the first call with `key` validates the inputs and prepares their launch, later calls
   * with that key reuse it (decode kernels launched every layer and step skip `validate`, `launch`
   * and the marshalling, ~10 µs of JavaScript a launch). The key must determine everything
   * `validate` and `launch` read from the inputs (shapes, dtypes, the settings a plan follows):
   * inputs of another class under the same key would launch with a wrong grid.
   */
  runKeyed(inputs: readonly MlxArray[], key: string, opts: Omit<KernelRunOptions, "verbose"> = {}): MlxArray[] {
    const { stream } = opts;
    const path = select_kernel_path(this.spec, opts.environment ?? kernel_environment(stream), opts.path);
    if (path === "reference") return this.run(inputs, { stream, path });
    let p = this.#keyed.get(key);
    if (!p) {
      this.#check(inputs);
      p = this.prepare(this.spec.launch(inputs));
      if (this.#keyed.size >= MAX_KEYED_LAUNCHES) this.#keyed.clear();
      this.#keyed.set(key, p);
    }
    return this.runPrepared(path, inputs, p, stream);
  }

  /** Input count and the spec's own check; a bad call throws naming the kernel and its inputs. */
  #check(inputs: readonly MlxArray[]): void {
    const { spec } = this;
    if (inputs.length !== spec.input_names.length) {
      throw new MlxError(`kernel ${spec.name}(${describeArgs(inputs)}): expected ${spec.input_names.length} inputs (${spec.input_names.join(", ")})`);
    }
    const problem = spec.validate?.(inputs);
    if (problem) throw new MlxError(`kernel ${spec.name}(${describeArgs(inputs)}): ${problem}`);
  }

  #kernel(backend: GpuBackend): Pointer {
    const have = this.#native.get(backend);
    if (have) return have;
    const { spec } = this;
    const src = spec[backend]!;
    const op = `kernel ${spec.name}`;
    const extra = backend === "metal" ? (spec.metal?.atomic_outputs ? 1 : 0) : (spec.cuda?.shared_memory ?? 0);
    if (backend === "cuda") checkDirectEnv();
    const h = checkHandle(
      lib().mlxb_kernel_new(
        backend === "metal" ? 1 : 2,
        cstr(spec.name),
        joinNames(op, spec.input_names),
        joinNames(op, spec.output_names),
        cstr(src.source),
        cstr(src.header ?? ""),
        spec.ensure_row_contiguous === false ? 0 : 1,
        extra,
        backend === "cuda" && spec.cuda?.direct ? 1 : 0,
      ),
      op,
    );
    this.#native.set(backend, h);
    return h;
  }

  #launch(backend: GpuBackend, inputs: readonly MlxArray[], opts: KernelRunOptions): MlxArray[] {
    return this.#call(backend, inputs, this.prepare(this.spec.launch(inputs)), opts.stream, opts.verbose);
  }

  /**
   * Marshal a launch once (output shapes, grid, template arguments) for `runPrepared`: a caller
   * that launches the same shapes many times (a model's layers, every decode step) skips
   * `validate`, `launch` and the marshalling on each call.
   */
  prepare(l: KernelLaunch): PreparedLaunch {
    const op = `kernel ${this.spec.name}`;
    const n = this.spec.output_names.length;
    if (l.output_shapes.length !== n || l.output_dtypes.length !== n) throw new MlxError(`${op}: launch must give ${n} output shapes and dtypes`);
    const dims = l.output_shapes.flat();
    const tmpl = l.template ?? [];
    const values = Int32Array.from(tmpl, ([name, v]) => {
      if (typeof v === "boolean") return v ? 1 : 0;
      if (typeof v === "number") {
        if (!Number.isInteger(v)) throw new MlxError(`${op}: template ${name} = ${v} is not an integer`);
        return v;
      }
      if (!isDtype(v)) throw new MlxError(`${op}: template ${name} = ${String(v)} is not a dtype`);
      return dtypeCode(v);
    });
    return {
      n_out: n,
      dims: dims.length ? Int32Array.from(dims) : null,
      ndims: Int32Array.from(l.output_shapes, (s) => s.length),
      dtypes: Int32Array.from(l.output_dtypes, (d) => dtypeCode(d)),
      grid: Int32Array.from(l.grid),
      threadgroup: Int32Array.from(l.threadgroup),
      names: tmpl.length
        ? joinNames(
            op,
            tmpl.map(([k]) => k),
          )
        : null,
      kinds: tmpl.length ? Int32Array.from(tmpl, ([, v]) => (typeof v === "boolean" ? 1 : typeof v === "number" ? 0 : 2)) : null,
      values: tmpl.length ? values : null,
      n_tmpl: tmpl.length,
      init: l.init_value,
    };
  }

  /**
   * Launch a prepared call on `backend` (which the caller has chosen, e.g. with `path()`), with
   * no validation: the caller guarantees the inputs are those the launch was prepared for.
   */
  runPrepared(backend: GpuBackend, inputs: readonly MlxArray[], p: PreparedLaunch, stream?: Stream): MlxArray[] {
    return this.#call(backend, inputs, p, stream, false);
  }

  #call(backend: GpuBackend, inputs: readonly MlxArray[], p: PreparedLaunch, stream: Stream | undefined, verbose: boolean | undefined): MlxArray[] {
    const h = lib().mlxb_kernel_call(
      this.#kernel(backend),
      handleList(inputs),
      inputs.length,
      p.dims,
      p.ndims,
      p.dtypes,
      p.n_out,
      p.grid,
      p.threadgroup,
      p.names,
      p.kinds,
      p.values,
      p.n_tmpl,
      p.init === undefined ? 0 : 1,
      p.init ?? 0,
      verbose ? 1 : 0,
      sh(stream),
    );
    return takeList(`kernel ${this.spec.name} (${backend})`, h, () => describeArgs(inputs));
  }

  /** Free the native kernel objects (module-level kernels may simply live for the process). */
  dispose(): void {
    for (const h of this.#native.values()) lib().mlxb_kernel_free(h);
    this.#native.clear();
    this.#keyed.clear();
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}

/** Declare a kernel (mx.fast.metal_kernel / mx.fast.cuda_kernel with a reference composition). */
export function custom_kernel(spec: KernelSpec): CustomKernel {
  return new CustomKernel(spec);
}
