// mx.distributed: process groups and collectives over MLX's own backends (ring over TCP, NCCL on
// CUDA, MPI/JACCL where the MLX build has them). Named like MLX Python: `mx.distributed.init()`,
// `group.rank()`, `group.split(color)`, `mx.distributed.all_sum(x, { group })`.
import { FFIType, type Pointer } from "bun:ffi";
import { checkHandle, checkStatus, cstr, type Dtype, dtypeCode, type MlxArray, MlxError, type Stream } from "@mlx-bun/mlx-ffi";
import { intArg, shapeArg } from "./axes.ts";
import { bindOps, result, sh } from "./native.ts";

const { ptr, i32, void: none } = FFIType;
const lib = bindOps({
  mlxb_dist_is_available: { args: [ptr], returns: i32 },
  mlxb_dist_init: { args: [i32, ptr], returns: ptr },
  mlxb_dist_group_free: { args: [ptr], returns: none },
  mlxb_dist_rank: { args: [ptr], returns: i32 },
  mlxb_dist_size: { args: [ptr], returns: i32 },
  mlxb_dist_split: { args: [ptr, i32, i32], returns: ptr },
  mlxb_dist_all_sum: { args: [ptr, ptr, ptr], returns: ptr },
  mlxb_dist_all_gather: { args: [ptr, ptr, ptr], returns: ptr },
  mlxb_dist_all_max: { args: [ptr, ptr, ptr], returns: ptr },
  mlxb_dist_all_min: { args: [ptr, ptr, ptr], returns: ptr },
  mlxb_dist_sum_scatter: { args: [ptr, ptr, ptr], returns: ptr },
  mlxb_dist_send: { args: [ptr, i32, ptr, ptr], returns: ptr },
  mlxb_dist_recv: { args: [ptr, i32, i32, i32, ptr, ptr], returns: ptr },
  mlxb_dist_recv_like: { args: [ptr, i32, ptr, ptr], returns: ptr },
});

/** Backends MLX can be built with; "any" picks the first one that starts. */
export type Backend = "any" | "ring" | "mpi" | "nccl" | "jaccl";
const BACKENDS: readonly Backend[] = ["any", "ring", "mpi", "nccl", "jaccl"];

function backendArg(op: string, b: Backend): Buffer {
  if (!BACKENDS.includes(b)) throw new MlxError(`${op}: unknown backend ${JSON.stringify(b)} (one of ${BACKENDS.join(", ")})`);
  return cstr(b);
}

/** mx.distributed.is_available(backend): whether this MLX build has the backend. */
export function is_available(backend: Backend = "any"): boolean {
  return checkStatus(lib().mlxb_dist_is_available(backendArg("is_available", backend)), "distributed.is_available", () => backend) === 1;
}

/** A group of processes that run collectives together (mx.distributed.Group). Owns one native handle. */
export class Group implements Disposable {
  #handle: Pointer | null;
  readonly #rank: number;
  readonly #size: number;

  /** @internal Wraps a handle returned by init or split. */
  constructor(handle: Pointer) {
    this.#handle = handle;
    this.#rank = checkStatus(lib().mlxb_dist_rank(handle), "distributed.Group.rank");
    this.#size = checkStatus(lib().mlxb_dist_size(handle), "distributed.Group.size");
  }

  /** The native handle; an error once disposed. */
  get handle(): Pointer {
    if (this.#handle === null) throw new MlxError("distributed.Group: used after dispose()");
    return this.#handle;
  }

  rank(): number {
    return this.#rank;
  }

  size(): number {
    return this.#size;
  }

  /**
   * Processes passing the same `color` form a new group; `key` orders them in it (default: their
   * rank here). Every process of this group must call split (it is a collective).
   */
  split(color: number, key = -1): Group {
    const c = intArg("distributed.Group.split", "color", color);
    const k = intArg("distributed.Group.split", "key", key);
    if (c < 0) throw new MlxError(`distributed.Group.split: color must be >= 0, got ${c}`);
    return new Group(checkHandle(lib().mlxb_dist_split(this.handle, c, k), "distributed.Group.split", () => `color=${c}, key=${k}`));
  }

  dispose(): void {
    if (this.#handle === null) return;
    lib().mlxb_dist_group_free(this.#handle);
    this.#handle = null;
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}

export interface InitOptions {
  /** Throw when no backend starts (default false: a size-1 group whose collectives are no-ops). */
  strict?: boolean;
  backend?: Backend;
}

/**
 * mx.distributed.init: the group of all processes, configured by the environment the launcher
 * sets (ring: MLX_HOSTFILE + MLX_RANK; nccl: NCCL_HOST_IP, NCCL_PORT, MLX_RANK, MLX_WORLD_SIZE).
 */
export function init(opts: InitOptions = {}): Group {
  const backend = opts.backend ?? "any";
  const b = backendArg("distributed.init", backend);
  return new Group(checkHandle(lib().mlxb_dist_init(opts.strict ? 1 : 0, b), "distributed.init", () => `backend=${backend}, strict=${Boolean(opts.strict)}`));
}

export interface CollectiveOptions {
  /** Default: the group of mx.distributed.init() (size 1 when none was launched). */
  group?: Group;
  stream?: Stream;
}

let defaultGroup: Group | undefined;
function groupOf(opts: CollectiveOptions): Group {
  return opts.group ?? (defaultGroup ??= init());
}

type CollectiveSym = "mlxb_dist_all_sum" | "mlxb_dist_all_gather" | "mlxb_dist_all_max" | "mlxb_dist_all_min" | "mlxb_dist_sum_scatter";
function collective(name: string, sym: CollectiveSym, x: MlxArray, opts: CollectiveOptions): MlxArray {
  const g = groupOf(opts);
  return result(`distributed.${name}`, lib()[sym](x.handle, g.handle, sh(opts.stream)), [x, `group(rank=${g.rank()}, size=${g.size()})`]);
}

/** Sum of x over the group; every process gets the same result. */
export function all_sum(x: MlxArray, opts: CollectiveOptions = {}): MlxArray {
  return collective("all_sum", "mlxb_dist_all_sum", x, opts);
}

/** The processes' x concatenated along axis 0, in rank order. */
export function all_gather(x: MlxArray, opts: CollectiveOptions = {}): MlxArray {
  return collective("all_gather", "mlxb_dist_all_gather", x, opts);
}

/** Element-wise maximum of x over the group. */
export function all_max(x: MlxArray, opts: CollectiveOptions = {}): MlxArray {
  return collective("all_max", "mlxb_dist_all_max", x, opts);
}

/** Element-wise minimum of x over the group. */
export function all_min(x: MlxArray, opts: CollectiveOptions = {}): MlxArray {
  return collective("all_min", "mlxb_dist_all_min", x, opts);
}

/** Sum over the group, then this rank's slice of axis 0 (reduce-scatter). */
export function sum_scatter(x: MlxArray, opts: CollectiveOptions = {}): MlxArray {
  return collective("sum_scatter", "mlxb_dist_sum_scatter", x, opts);
}

/** Send x to rank `dst`; the returned array completes when it has been sent (evaluate it). */
export function send(x: MlxArray, dst: number, opts: CollectiveOptions = {}): MlxArray {
  const g = groupOf(opts);
  const d = intArg("distributed.send", "dst", dst);
  return result("distributed.send", lib().mlxb_dist_send(x.handle, d, g.handle, sh(opts.stream)), [x, `dst=${d}`]);
}

/** Receive an array of this shape and dtype from rank `src`. */
export function recv(shape: readonly number[], dtype: Dtype, src: number, opts: CollectiveOptions = {}): MlxArray {
  const g = groupOf(opts);
  const s = intArg("distributed.recv", "src", src);
  const [p, n] = shapeArg("distributed.recv", shape);
  return result("distributed.recv", lib().mlxb_dist_recv(p, n, dtypeCode(dtype), s, g.handle, sh(opts.stream)), [`[${shape.join(", ")}]`, dtype, `src=${s}`]);
}

/** Receive an array shaped and typed like x from rank `src`. */
export function recv_like(x: MlxArray, src: number, opts: CollectiveOptions = {}): MlxArray {
  const g = groupOf(opts);
  const s = intArg("distributed.recv_like", "src", src);
  return result("distributed.recv_like", lib().mlxb_dist_recv_like(x.handle, s, g.handle, sh(opts.stream)), [x, `src=${s}`]);
}
