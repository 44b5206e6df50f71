// Reductions, scans and sorting (mx.sum, mx.argmax, mx.softmax, mx.cumsum, mx.topk, ...).
import { FFIType } from "bun:ffi";
import type { MlxArray, Stream } from "@mlx-bun/mlx-ffi";
import { type Axes, axesArg, intArg } from "./axes.ts";
import { bindOps, result, sh, sig } from "./native.ts";

const { ptr, i32 } = FFIType;
const argReduce = { args: [ptr, i32, i32, i32, ptr], returns: ptr } as const; // (a, axis, flat, keepdims, s)
const scan = { args: [ptr, i32, i32, i32, i32, ptr], returns: ptr } as const; // (a, axis, flat, reverse, inclusive, s)
const sortSig = { args: [ptr, i32, i32, ptr], returns: ptr } as const; // (a, axis, flat, s)
const ksort = { args: [ptr, i32, i32, i32, ptr], returns: ptr } as const; // (a, k, axis, flat, s)
const ddof = { args: [ptr, ptr, i32, i32, i32, ptr], returns: ptr } as const; // (a, axes*, n, keepdims, ddof, s)

const lib = bindOps({
  mlxb_sum: sig.reduce,
  mlxb_mean: sig.reduce,
  mlxb_max: sig.reduce,
  mlxb_min: sig.reduce,
  mlxb_prod: sig.reduce,
  mlxb_all: sig.reduce,
  mlxb_any: sig.reduce,
  mlxb_logsumexp: sig.reduce,
  mlxb_var: ddof,
  mlxb_std: ddof,
  mlxb_argmax: argReduce,
  mlxb_argmin: argReduce,
  mlxb_softmax: { args: [ptr, ptr, i32, i32, ptr], returns: ptr },
  mlxb_cumsum: scan,
  mlxb_cumprod: scan,
  mlxb_cummax: scan,
  mlxb_cummin: scan,
  mlxb_logcumsumexp: scan,
  mlxb_sort: sortSig,
  mlxb_argsort: sortSig,
  mlxb_partition: ksort,
  mlxb_argpartition: ksort,
  mlxb_topk: ksort,
});

export interface ReduceOptions {
  keepdims?: boolean;
  stream?: Stream;
}

type ReduceName = "sum" | "mean" | "max" | "min" | "prod" | "all" | "any" | "logsumexp";
function reduction(name: ReduceName) {
  const sym = `mlxb_${name}` as const;
  return (a: MlxArray, axes?: Axes, opts: ReduceOptions = {}): MlxArray => {
    const [p, n] = axesArg(name, axes);
    return result(name, lib()[sym](a.handle, p, n, opts.keepdims ? 1 : 0, sh(opts.stream)), [a, () => `axis=${String(axes)}`]);
  };
}

/** mx.sum over `axes` (all when omitted). */
export const sum = reduction("sum");
export const mean = reduction("mean");
export const max = reduction("max");
export const min = reduction("min");
export const prod = reduction("prod");
export const all = reduction("all");
export const any = reduction("any");
export const logsumexp = reduction("logsumexp");

export interface VarOptions extends ReduceOptions {
  /** Delta degrees of freedom: the divisor is N - ddof. */
  ddof?: number;
}
function ddofReduction(name: "var" | "std") {
  const sym = `mlxb_${name}` as const;
  return (a: MlxArray, axes?: Axes, opts: VarOptions = {}): MlxArray => {
    const [p, n] = axesArg(name, axes);
    const d = intArg(name, "ddof", opts.ddof ?? 0);
    return result(name, lib()[sym](a.handle, p, n, opts.keepdims ? 1 : 0, d, sh(opts.stream)), [a, () => `axis=${String(axes)}`, () => `ddof=${d}`]);
  };
}
/** mx.var */
export const variance = ddofReduction("var");
/** mx.std */
export const std = ddofReduction("std");
// `var` is a reserved word in JS; `variance` is the export and `var` an alias for `import * as mx`.
export { variance as var };

/** A single axis, or undefined for the flattened array (Python's axis=None). */
function oneAxis(op: string, axis: number | null | undefined): [number, number] {
  if (axis === undefined || axis === null) return [0, 1];
  return [intArg(op, "axis", axis), 0];
}

function argReduction(name: "argmax" | "argmin") {
  const sym = `mlxb_${name}` as const;
  return (a: MlxArray, axis?: number, opts: ReduceOptions = {}): MlxArray => {
    const [ax, flat] = oneAxis(name, axis);
    return result(name, lib()[sym](a.handle, ax, flat, opts.keepdims ? 1 : 0, sh(opts.stream)), [a, () => `axis=${String(axis)}`]);
  };
}
/** mx.argmax (uint32 indices); over the flattened array when `axis` is omitted. */
export const argmax = argReduction("argmax");
export const argmin = argReduction("argmin");

export interface SoftmaxOptions {
  /** Accumulate in float32 for half-precision inputs (mx.softmax's `precise`). */
  precise?: boolean;
  stream?: Stream;
}
/** mx.softmax over `axes` (all when omitted). */
export function softmax(a: MlxArray, axes?: Axes, opts: SoftmaxOptions = {}): MlxArray {
  const [p, n] = axesArg("softmax", axes);
  return result("softmax", lib().mlxb_softmax(a.handle, p, n, opts.precise ? 1 : 0, sh(opts.stream)), [a, () => `axis=${String(axes)}`]);
}

export interface ScanOptions {
  reverse?: boolean;
  /** Include the element itself (default true). */
  inclusive?: boolean;
  stream?: Stream;
}
type ScanName = "cumsum" | "cumprod" | "cummax" | "cummin" | "logcumsumexp";
function scanOp(name: ScanName) {
  const sym = `mlxb_${name}` as const;
  return (a: MlxArray, axis?: number | null, opts: ScanOptions = {}): MlxArray => {
    const [ax, flat] = oneAxis(name, axis);
    return result(name, lib()[sym](a.handle, ax, flat, opts.reverse ? 1 : 0, opts.inclusive === false ? 0 : 1, sh(opts.stream)), [
      a,
      () => `axis=${String(axis)}`,
    ]);
  };
}
/** mx.cumsum along `axis` (the flattened array when omitted or null). */
export const cumsum = scanOp("cumsum");
export const cumprod = scanOp("cumprod");
export const cummax = scanOp("cummax");
export const cummin = scanOp("cummin");
export const logcumsumexp = scanOp("logcumsumexp");

/** Sorting ops default to the last axis as in MLX; `null` means the flattened array. */
function sortAxis(op: string, axis: number | null): [number, number] {
  return axis === null ? [0, 1] : [intArg(op, "axis", axis), 0];
}

/** mx.sort (stable; NaN last) along `axis` (default -1; null: flattened). */
export function sort(a: MlxArray, axis: number | null = -1, s?: Stream): MlxArray {
  const [ax, flat] = sortAxis("sort", axis);
  return result("sort", lib().mlxb_sort(a.handle, ax, flat, sh(s)), [a, () => `axis=${String(axis)}`]);
}

/** mx.argsort (uint32 indices). */
export function argsort(a: MlxArray, axis: number | null = -1, s?: Stream): MlxArray {
  const [ax, flat] = sortAxis("argsort", axis);
  return result("argsort", lib().mlxb_argsort(a.handle, ax, flat, sh(s)), [a, () => `axis=${String(axis)}`]);
}

function kOp(name: "partition" | "argpartition" | "topk", argName: string) {
  const sym = `mlxb_${name}` as const;
  return (a: MlxArray, k: number, axis: number | null = -1, s?: Stream): MlxArray => {
    intArg(name, argName, k);
    const [ax, flat] = sortAxis(name, axis);
    return result(name, lib()[sym](a.handle, k, ax, flat, sh(s)), [a, () => `${argName}=${k}`, () => `axis=${String(axis)}`]);
  };
}
/** mx.partition: the kth element in its sorted place, smaller before, larger after. */
export const partition = kOp("partition", "kth");
/** mx.argpartition (uint32 indices). */
export const argpartition = kOp("argpartition", "kth");
/** mx.topk: the k largest elements along `axis` (not in sorted order). */
export const topk = kOp("topk", "k");
