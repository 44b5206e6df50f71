// Array creation (mx.zeros, mx.full, mx.arange, mx.eye, mx.tri, mx.array, ...).
import { FFIType } from "bun:ffi";
import { type Dtype, dtypeCode, MlxArray, MlxError, type NestedList, type Stream } from "@mlx-bun/mlx-ffi";
import { intArg, shapeArg } from "./axes.ts";
import { bindOps, result, sh } from "./native.ts";
import { type Scalar, scalarDtype } from "./scalar.ts";

const { ptr, i32, f64 } = FFIType;
const lib = bindOps({
  mlxb_zeros: { args: [ptr, i32, i32, ptr], returns: ptr },
  mlxb_ones: { args: [ptr, i32, i32, ptr], returns: ptr },
  mlxb_full: { args: [ptr, i32, ptr, i32, ptr], returns: ptr },
  mlxb_zeros_like: { args: [ptr, i32, ptr], returns: ptr },
  mlxb_ones_like: { args: [ptr, i32, ptr], returns: ptr },
  mlxb_full_like: { args: [ptr, ptr, i32, ptr], returns: ptr },
  mlxb_arange: { args: [f64, f64, f64, i32, ptr], returns: ptr },
  mlxb_linspace: { args: [f64, f64, i32, i32, i32, ptr], returns: ptr },
  mlxb_eye: { args: [i32, i32, i32, i32, ptr], returns: ptr },
  mlxb_tri: { args: [i32, i32, i32, i32, ptr], returns: ptr },
  mlxb_tril: { args: [ptr, i32, ptr], returns: ptr },
  mlxb_triu: { args: [ptr, i32, ptr], returns: ptr },
  mlxb_copy: { args: [ptr, ptr], returns: ptr },
});

const shapeOf = (shape: number | readonly number[]): readonly number[] => (typeof shape === "number" ? [shape] : shape);

/** mx.zeros (default float32). */
export function zeros(shape: number | readonly number[], dtype: Dtype = "float32", s?: Stream): MlxArray {
  const [p, n] = shapeArg("zeros", shapeOf(shape));
  return result("zeros", lib().mlxb_zeros(p, n, dtypeCode(dtype), sh(s)), [`[${shapeOf(shape).join(", ")}]`, dtype]);
}

/** mx.ones (default float32). */
export function ones(shape: number | readonly number[], dtype: Dtype = "float32", s?: Stream): MlxArray {
  const [p, n] = shapeArg("ones", shapeOf(shape));
  return result("ones", lib().mlxb_ones(p, n, dtypeCode(dtype), sh(s)), [`[${shapeOf(shape).join(", ")}]`, dtype]);
}

/**
 * mx.full: `vals` broadcast to `shape`. Without a dtype a JS number gives int32 (integer) or
 * float32, a boolean gives bool, an array keeps its dtype. With a dtype the result has that
 * dtype (MLX Python 0.32 returns float32 for `mx.full(s, 1.5, mx.int32)`; we cast as documented).
 */
export function full(shape: number | readonly number[], vals: MlxArray | Scalar, dtype?: Dtype, s?: Stream): MlxArray {
  const [p, n] = shapeArg("full", shapeOf(shape));
  const v = vals instanceof MlxArray ? vals : MlxArray.scalar(vals, scalarDtype(vals, undefined));
  try {
    return result("full", lib().mlxb_full(p, n, v.handle, dtype === undefined ? -1 : dtypeCode(dtype), sh(s)), [
      `[${shapeOf(shape).join(", ")}]`,
      v,
      dtype ?? "None",
    ]);
  } finally {
    if (v !== vals) v.dispose();
  }
}

/** mx.zeros_like (a's dtype unless given). */
export function zeros_like(a: MlxArray, dtype?: Dtype, s?: Stream): MlxArray {
  return result("zeros_like", lib().mlxb_zeros_like(a.handle, dtype === undefined ? -1 : dtypeCode(dtype), sh(s)), [a]);
}

/** mx.ones_like (a's dtype unless given). */
export function ones_like(a: MlxArray, dtype?: Dtype, s?: Stream): MlxArray {
  return result("ones_like", lib().mlxb_ones_like(a.handle, dtype === undefined ? -1 : dtypeCode(dtype), sh(s)), [a]);
}

/** mx.full_like: a's shape filled with `vals` (a's dtype unless given). */
export function full_like(a: MlxArray, vals: MlxArray | Scalar, dtype?: Dtype, s?: Stream): MlxArray {
  const v = vals instanceof MlxArray ? vals : MlxArray.scalar(vals, scalarDtype(vals, dtype ?? a.dtype));
  try {
    return result("full_like", lib().mlxb_full_like(a.handle, v.handle, dtype === undefined ? -1 : dtypeCode(dtype), sh(s)), [a, v]);
  } finally {
    if (v !== vals) v.dispose();
  }
}

export interface ArangeOptions {
  dtype?: Dtype;
  stream?: Stream;
}

/**
 * mx.arange: `arange(stop)`, `arange(start, stop)`, `arange(start, stop, step)`, plus options.
 * The dtype defaults to int32 when every argument is an integer, else float32 (as MLX Python;
 * JS cannot tell `2.0` from `2`, so pass `{ dtype: "float32" }` for a float range of integers).
 */
export function arange(stop: number, opts?: ArangeOptions): MlxArray;
export function arange(start: number, stop: number, opts?: ArangeOptions): MlxArray;
export function arange(start: number, stop: number, step: number, opts?: ArangeOptions): MlxArray;
export function arange(a: number, b?: number | ArangeOptions, c?: number | ArangeOptions, d?: ArangeOptions): MlxArray {
  const nums = [a, b, c].filter((x): x is number => typeof x === "number");
  const opts = [b, c, d].find((x): x is ArangeOptions => typeof x === "object" && x !== null) ?? {};
  const [start, stop, step] = nums.length === 1 ? [0, nums[0]!, 1] : nums.length === 2 ? [nums[0]!, nums[1]!, 1] : [nums[0]!, nums[1]!, nums[2]!];
  for (const v of nums) if (!Number.isFinite(v)) throw new MlxError(`arange: ${v} is not a finite number`);
  const dtype = opts.dtype ?? (nums.every(Number.isInteger) ? "int32" : "float32");
  return result("arange", lib().mlxb_arange(start, stop, step, dtypeCode(dtype), sh(opts.stream)), [start, stop, step, dtype]);
}

export interface LinspaceOptions {
  /** Include `stop` (default true). */
  endpoint?: boolean;
  dtype?: Dtype;
  stream?: Stream;
}
/** mx.linspace: `num` evenly spaced values over [start, stop] (default float32). */
export function linspace(start: number, stop: number, num = 50, opts: LinspaceOptions = {}): MlxArray {
  intArg("linspace", "num", num);
  const dtype = opts.dtype ?? "float32";
  return result("linspace", lib().mlxb_linspace(start, stop, num, opts.endpoint === false ? 0 : 1, dtypeCode(dtype), sh(opts.stream)), [
    start,
    stop,
    num,
    dtype,
  ]);
}

export interface MatrixOptions {
  /** Columns (default n). */
  m?: number;
  /** Diagonal offset (default 0). */
  k?: number;
  dtype?: Dtype;
  stream?: Stream;
}
/** The checked (n, m, k, dtype) of mx.eye / mx.tri. */
function matrixArgs(op: string, n: number, opts: MatrixOptions): [number, number, number, Dtype] {
  const m = opts.m ?? n;
  const k = opts.k ?? 0;
  intArg(op, "n", n);
  intArg(op, "m", m);
  intArg(op, "k", k);
  return [n, m, k, opts.dtype ?? "float32"];
}

/** mx.eye: ones on the k-th diagonal of an n x m matrix (default float32). */
export function eye(n: number, opts: MatrixOptions = {}): MlxArray {
  const [, m, k, dtype] = matrixArgs("eye", n, opts);
  return result("eye", lib().mlxb_eye(n, m, k, dtypeCode(dtype), sh(opts.stream)), [n, m, k, dtype]);
}

/** mx.identity */
export function identity(n: number, dtype: Dtype = "float32", s?: Stream): MlxArray {
  return eye(n, { dtype, stream: s });
}

/** mx.tri: ones at and below the k-th diagonal of an n x m matrix (default float32). */
export function tri(n: number, opts: MatrixOptions = {}): MlxArray {
  const [, m, k, dtype] = matrixArgs("tri", n, opts);
  return result("tri", lib().mlxb_tri(n, m, k, dtypeCode(dtype), sh(opts.stream)), [n, m, k, dtype]);
}

/** mx.tril: zero above the k-th diagonal. */
export function tril(x: MlxArray, k = 0, s?: Stream): MlxArray {
  intArg("tril", "k", k);
  return result("tril", lib().mlxb_tril(x.handle, k, sh(s)), [x, `k=${k}`]);
}

/** mx.triu: zero below the k-th diagonal. */
export function triu(x: MlxArray, k = 0, s?: Stream): MlxArray {
  intArg("triu", "k", k);
  return result("triu", lib().mlxb_triu(x.handle, k, sh(s)), [x, `k=${k}`]);
}

/** mx.copy: a new array with the same values. */
export function copy(a: MlxArray, s?: Stream): MlxArray {
  return result("copy", lib().mlxb_copy(a.handle, sh(s)), [a]);
}

/**
 * mx.array from nested JS lists (or a number/boolean): the shape is the nesting; without a dtype,
 * all booleans give bool, all integers int32, otherwise float32. Ragged lists throw.
 */
export function array(values: NestedList | readonly NestedList[], dtype?: Dtype): MlxArray {
  const shape: number[] = [];
  let probe: unknown = values;
  while (Array.isArray(probe)) {
    shape.push(probe.length);
    probe = probe[0];
  }
  const flat: (number | bigint | boolean)[] = [];
  const walk = (v: unknown, depth: number): void => {
    if (depth === shape.length) {
      if (Array.isArray(v)) throw new MlxError(`array: ragged nested list (expected shape [${shape.join(", ")}])`);
      if (typeof v !== "number" && typeof v !== "boolean" && typeof v !== "bigint") {
        throw new MlxError(`array: unsupported element ${String(v)}`);
      }
      flat.push(v);
      return;
    }
    if (!Array.isArray(v) || v.length !== shape[depth]) throw new MlxError(`array: ragged nested list (expected shape [${shape.join(", ")}])`);
    for (const x of v) walk(x, depth + 1);
  };
  walk(values, 0);
  let dt: Dtype = dtype ?? "float32";
  if (dtype === undefined && flat.length) {
    if (flat.every((v) => typeof v === "boolean")) dt = "bool";
    else if (flat.every((v) => typeof v === "bigint" || (typeof v === "number" && Number.isInteger(v)) || typeof v === "boolean")) {
      dt = flat.some((v) => typeof v === "bigint" || (typeof v === "number" && (v > 0x7fffffff || v < -0x80000000))) ? "int64" : "int32";
    }
  }
  return MlxArray.fromNumbers(flat, shape, dt);
}
