// Shape and indexing ops (mx.reshape, mx.concatenate, mx.split, mx.slice, mx.take, a[...] via index(), ...).
import { FFIType } from "bun:ffi";
import { handleList, MlxArray, MlxError, Stream } from "@mlx-bun/mlx-ffi";
import { type Axes, axesArg, fmt, intArg, intsArg, shapeArg } from "./axes.ts";
import { bindOps, result, sh } from "./native.ts";
import { takeList } from "./list.ts";
import { type Scalar, scalarDtype } from "./scalar.ts";

const { ptr, i32 } = FFIType;
const lib = bindOps({
  mlxb_reshape: { args: [ptr, ptr, i32, ptr], returns: ptr },
  mlxb_transpose: { args: [ptr, ptr, i32, ptr], returns: ptr },
  mlxb_swapaxes: { args: [ptr, i32, i32, ptr], returns: ptr },
  mlxb_moveaxis: { args: [ptr, i32, i32, ptr], returns: ptr },
  mlxb_squeeze: { args: [ptr, ptr, i32, ptr], returns: ptr },
  mlxb_expand_dims: { args: [ptr, ptr, i32, ptr], returns: ptr },
  mlxb_broadcast_to: { args: [ptr, ptr, i32, ptr], returns: ptr },
  mlxb_flatten: { args: [ptr, i32, i32, ptr], returns: ptr },
  mlxb_unflatten: { args: [ptr, i32, ptr, i32, ptr], returns: ptr },
  mlxb_contiguous: { args: [ptr, i32, ptr], returns: ptr },
  mlxb_concatenate: { args: [ptr, i32, i32, i32, ptr], returns: ptr },
  mlxb_stack: { args: [ptr, i32, i32, ptr], returns: ptr },
  mlxb_split_sections: { args: [ptr, i32, i32, ptr], returns: ptr },
  mlxb_split_indices: { args: [ptr, ptr, i32, i32, ptr], returns: ptr },
  mlxb_slice: { args: [ptr, ptr, ptr, ptr, i32, ptr], returns: ptr },
  mlxb_slice_dynamic: { args: [ptr, ptr, ptr, i32, ptr, i32, ptr], returns: ptr },
  mlxb_slice_update: { args: [ptr, ptr, ptr, ptr, ptr, i32, ptr], returns: ptr },
  mlxb_slice_update_dynamic: { args: [ptr, ptr, ptr, ptr, i32, ptr], returns: ptr },
  mlxb_take: { args: [ptr, ptr, i32, i32, ptr], returns: ptr },
  mlxb_take_int: { args: [ptr, i32, i32, i32, ptr], returns: ptr },
  mlxb_take_along_axis: { args: [ptr, ptr, i32, i32, ptr], returns: ptr },
  mlxb_put_along_axis: { args: [ptr, ptr, ptr, i32, i32, ptr], returns: ptr },
  mlxb_pad: { args: [ptr, ptr, ptr, ptr, i32, ptr, i32, ptr], returns: ptr },
  mlxb_repeat: { args: [ptr, i32, i32, i32, ptr], returns: ptr },
  mlxb_tile: { args: [ptr, ptr, i32, ptr], returns: ptr },
  mlxb_roll: { args: [ptr, i32, i32, i32, ptr], returns: ptr },
  mlxb_index: { args: [ptr, ptr, i32, ptr, i32, ptr], returns: ptr },
});

/** mx.reshape; one dimension may be -1. */
export function reshape(a: MlxArray, shape: readonly number[], s?: Stream): MlxArray {
  for (const d of shape) if (!Number.isInteger(d) || d < -1) throw new MlxError(`reshape: invalid shape ${fmt(shape)}`);
  const [p, n] = intsArg("reshape", "shape", shape);
  return result("reshape", lib().mlxb_reshape(a.handle, p, n, sh(s)), [a, shape]);
}

/** mx.transpose; reverses the axes when `axes` is omitted. */
export function transpose(a: MlxArray, axes?: readonly number[], s?: Stream): MlxArray {
  const [p, n] = axes === undefined ? [null, -1] : intsArg("transpose", "axes", axes);
  return result("transpose", lib().mlxb_transpose(a.handle, p, n, sh(s)), [a, axes ?? "None"]);
}

export function swapaxes(a: MlxArray, axis1: number, axis2: number, s?: Stream): MlxArray {
  intArg("swapaxes", "axis1", axis1);
  intArg("swapaxes", "axis2", axis2);
  return result("swapaxes", lib().mlxb_swapaxes(a.handle, axis1, axis2, sh(s)), [a, axis1, axis2]);
}

export function moveaxis(a: MlxArray, source: number, destination: number, s?: Stream): MlxArray {
  intArg("moveaxis", "source", source);
  intArg("moveaxis", "destination", destination);
  return result("moveaxis", lib().mlxb_moveaxis(a.handle, source, destination, sh(s)), [a, source, destination]);
}

/** mx.squeeze: drop size-one axes (all of them when `axes` is omitted). */
export function squeeze(a: MlxArray, axes?: Axes, s?: Stream): MlxArray {
  const [p, n] = axesArg("squeeze", axes);
  return result("squeeze", lib().mlxb_squeeze(a.handle, p, n, sh(s)), [a, () => `axis=${String(axes)}`]);
}

export function expand_dims(a: MlxArray, axes: number | readonly number[], s?: Stream): MlxArray {
  const [p, n] = intsArg("expand_dims", "axis", typeof axes === "number" ? [axes] : axes);
  return result("expand_dims", lib().mlxb_expand_dims(a.handle, p, n, sh(s)), [a, () => `axis=${String(axes)}`]);
}

export function broadcast_to(a: MlxArray, shape: readonly number[], s?: Stream): MlxArray {
  const [p, n] = shapeArg("broadcast_to", shape);
  return result("broadcast_to", lib().mlxb_broadcast_to(a.handle, p, n, sh(s)), [a, shape]);
}

/** mx.flatten axes start_axis..end_axis (inclusive). */
export function flatten(a: MlxArray, start_axis = 0, end_axis = -1, s?: Stream): MlxArray {
  intArg("flatten", "start_axis", start_axis);
  intArg("flatten", "end_axis", end_axis);
  return result("flatten", lib().mlxb_flatten(a.handle, start_axis, end_axis, sh(s)), [a, start_axis, end_axis]);
}

/** mx.unflatten one axis into `shape` (one entry may be -1). */
export function unflatten(a: MlxArray, axis: number, shape: readonly number[], s?: Stream): MlxArray {
  intArg("unflatten", "axis", axis);
  const [p, n] = intsArg("unflatten", "shape", shape);
  return result("unflatten", lib().mlxb_unflatten(a.handle, axis, p, n, sh(s)), [a, axis, shape]);
}

/** mx.contiguous: a row-contiguous copy if needed. */
export function contiguous(a: MlxArray, allow_col_major = false, s?: Stream): MlxArray {
  return result("contiguous", lib().mlxb_contiguous(a.handle, allow_col_major ? 1 : 0, sh(s)), [a]);
}

function arrayList(op: string, arrays: readonly MlxArray[]): BigUint64Array {
  if (!Array.isArray(arrays) || arrays.some((x) => !(x instanceof MlxArray))) {
    throw new MlxError(`${op}: expected a list of MlxArrays`);
  }
  return handleList(arrays);
}

/** mx.concatenate along `axis` (default 0; null: flatten every array first). */
export function concatenate(arrays: readonly MlxArray[], axis: number | null = 0, s?: Stream): MlxArray {
  const hs = arrayList("concatenate", arrays);
  const flat = axis === null ? 1 : 0;
  const ax = axis === null ? 0 : intArg("concatenate", "axis", axis);
  return result("concatenate", lib().mlxb_concatenate(arrays.length ? hs : null, arrays.length, ax, flat, sh(s)), [...arrays, () => `axis=${String(axis)}`]);
}

/** mx.stack along a new axis. */
export function stack(arrays: readonly MlxArray[], axis = 0, s?: Stream): MlxArray {
  const hs = arrayList("stack", arrays);
  intArg("stack", "axis", axis);
  return result("stack", lib().mlxb_stack(arrays.length ? hs : null, arrays.length, axis, sh(s)), [...arrays, () => `axis=${axis}`]);
}

/**
 * mx.split: a number gives that many equal parts; a list gives the indices to split at
 * (`indices.length + 1` parts). Returns one MlxArray per part.
 */
export function split(a: MlxArray, indices_or_sections: number | readonly number[], axis = 0, s?: Stream): MlxArray[] {
  intArg("split", "axis", axis);
  const ctx = () => `${a.describe()}, ${typeof indices_or_sections === "number" ? indices_or_sections : fmt(indices_or_sections)}, axis=${axis}`;
  if (typeof indices_or_sections === "number") {
    const n = intArg("split", "sections", indices_or_sections);
    if (n <= 0) throw new MlxError(`split(${ctx()}): the number of sections must be positive`);
    return takeList("split", lib().mlxb_split_sections(a.handle, n, axis, sh(s)), ctx);
  }
  const [p, n] = intsArg("split", "indices", indices_or_sections);
  return takeList("split", lib().mlxb_split_indices(a.handle, p, n, axis, sh(s)), ctx);
}

/**
 * mx.slice. Static form: `slice(a, start, stop, strides?)` with one entry per axis (C++
 * mx::slice). Dynamic form (MLX Python's mx.slice): `slice(a, startIndices, axes, sliceSize)`
 * with the start given as an integer array, so the graph does not change with the offset.
 */
export function slice(a: MlxArray, start: readonly number[], stop: readonly number[], strides?: readonly number[], s?: Stream): MlxArray;
export function slice(a: MlxArray, start: MlxArray, axes: readonly number[], slice_size: readonly number[], s?: Stream): MlxArray;
export function slice(a: MlxArray, start: readonly number[] | MlxArray, stopOrAxes: readonly number[], third?: readonly number[], s?: Stream): MlxArray {
  if (start instanceof MlxArray) {
    if (!third) throw new MlxError("slice: slice_size is required with an array start");
    const [pa, na] = intsArg("slice", "axes", stopOrAxes);
    const [ps, ns] = shapeArg("slice", third);
    return result("slice", lib().mlxb_slice_dynamic(a.handle, start.handle, pa, na, ps, ns, sh(s)), [
      a,
      start,
      () => `axes=${fmt(stopOrAxes)}, slice_size=${fmt(third)}`,
    ]);
  }
  const n = start.length;
  const strides = third ?? new Array<number>(n).fill(1);
  if (stopOrAxes.length !== n || strides.length !== n) {
    throw new MlxError(`slice: start ${fmt(start)}, stop ${fmt(stopOrAxes)} and strides ${fmt(strides)} must have the same length`);
  }
  const [p0] = intsArg("slice", "start", start);
  const [p1] = intsArg("slice", "stop", stopOrAxes);
  const [p2] = intsArg("slice", "strides", strides);
  return result("slice", lib().mlxb_slice(a.handle, p0, p1, p2, n, sh(s)), [a, () => `start=${fmt(start)}, stop=${fmt(stopOrAxes)}, strides=${fmt(strides)}`]);
}

/**
 * mx.slice_update: `src` with the region replaced by `update`. Static form:
 * `slice_update(src, update, start, stop, strides?)`; dynamic form (MLX Python's):
 * `slice_update(src, update, startIndices: MlxArray, axes)`.
 */
export function slice_update(
  src: MlxArray,
  update: MlxArray,
  start: readonly number[],
  stop: readonly number[],
  strides?: readonly number[],
  s?: Stream,
): MlxArray;
export function slice_update(src: MlxArray, update: MlxArray, start: MlxArray, axes: readonly number[], s?: Stream): MlxArray;
export function slice_update(
  src: MlxArray,
  update: MlxArray,
  start: readonly number[] | MlxArray,
  stopOrAxes: readonly number[],
  fifth?: readonly number[] | Stream,
  sixth?: Stream,
): MlxArray {
  if (start instanceof MlxArray) {
    const s = fifth as Stream | undefined;
    const [pa, na] = intsArg("slice_update", "axes", stopOrAxes);
    return result("slice_update", lib().mlxb_slice_update_dynamic(src.handle, update.handle, start.handle, pa, na, sh(s)), [
      src,
      update,
      start,
      () => `axes=${fmt(stopOrAxes)}`,
    ]);
  }
  const n = start.length;
  const strides = (fifth as readonly number[] | undefined) ?? new Array<number>(n).fill(1);
  if (stopOrAxes.length !== n || strides.length !== n) {
    throw new MlxError(`slice_update: start ${fmt(start)}, stop ${fmt(stopOrAxes)} and strides ${fmt(strides)} must have the same length`);
  }
  const [p0] = intsArg("slice_update", "start", start);
  const [p1] = intsArg("slice_update", "stop", stopOrAxes);
  const [p2] = intsArg("slice_update", "strides", strides);
  return result("slice_update", lib().mlxb_slice_update(src.handle, update.handle, p0, p1, p2, n, sh(sixth)), [
    src,
    update,
    () => `start=${fmt(start)}, stop=${fmt(stopOrAxes)}`,
  ]);
}

/** mx.take: elements at `indices` along `axis` (the flattened array when omitted). */
export function take(a: MlxArray, indices: MlxArray | number, axis?: number, s?: Stream): MlxArray {
  const flat = axis === undefined ? 1 : 0;
  const ax = axis === undefined ? 0 : intArg("take", "axis", axis);
  if (typeof indices === "number") {
    intArg("take", "index", indices);
    return result("take", lib().mlxb_take_int(a.handle, indices, ax, flat, sh(s)), [a, indices, () => `axis=${String(axis)}`]);
  }
  return result("take", lib().mlxb_take(a.handle, indices.handle, ax, flat, sh(s)), [a, indices, () => `axis=${String(axis)}`]);
}

/** mx.take_along_axis (axis null: over the flattened arrays). */
export function take_along_axis(a: MlxArray, indices: MlxArray, axis: number | null, s?: Stream): MlxArray {
  const flat = axis === null ? 1 : 0;
  const ax = axis === null ? 0 : intArg("take_along_axis", "axis", axis);
  return result("take_along_axis", lib().mlxb_take_along_axis(a.handle, indices.handle, ax, flat, sh(s)), [a, indices, () => `axis=${String(axis)}`]);
}

/** mx.put_along_axis: `a` with `values` written at `indices` along `axis` (null: flattened). */
export function put_along_axis(a: MlxArray, indices: MlxArray, values: MlxArray | Scalar, axis: number | null, s?: Stream): MlxArray {
  const flat = axis === null ? 1 : 0;
  const ax = axis === null ? 0 : intArg("put_along_axis", "axis", axis);
  const v = values instanceof MlxArray ? values : MlxArray.scalar(values, scalarDtype(values, a.dtype));
  try {
    return result("put_along_axis", lib().mlxb_put_along_axis(a.handle, indices.handle, v.handle, ax, flat, sh(s)), [
      a,
      indices,
      v,
      () => `axis=${String(axis)}`,
    ]);
  } finally {
    if (v !== values) v.dispose();
  }
}

export type PadWidth = number | readonly [number] | readonly [number, number] | readonly (readonly [number, number])[];
export interface PadOptions {
  mode?: "constant" | "edge" | "reflect" | "symmetric";
  /** The fill of "constant" mode (default 0), cast to a's dtype. */
  constant_values?: MlxArray | Scalar;
  stream?: Stream;
}
const PAD_MODES = ["constant", "edge", "reflect", "symmetric"] as const;

/** mx.pad: `n` pads every axis by n on both sides; `[lo, hi]` every axis; `[[lo, hi], ...]` per axis. */
export function pad(a: MlxArray, pad_width: PadWidth, opts: PadOptions = {}): MlxArray {
  const ndim = a.ndim;
  let pairs: (readonly [number, number])[];
  if (typeof pad_width === "number") pairs = [[pad_width, pad_width]];
  else if (pad_width.length === 1 && typeof pad_width[0] === "number") pairs = [[pad_width[0], pad_width[0]]];
  else if (pad_width.length === 2 && typeof pad_width[0] === "number") pairs = [pad_width as readonly [number, number]];
  else pairs = (pad_width as readonly (readonly [number, number])[]).slice();
  if (pairs.length === 1) pairs = new Array(ndim).fill(pairs[0]);
  if (pairs.length !== ndim || pairs.some((p) => !Array.isArray(p) || p.length !== 2)) {
    throw new MlxError(`pad(${a.describe()}): pad_width ${JSON.stringify(pad_width)} must give one (low, high) pair per axis`);
  }
  const mode = PAD_MODES.indexOf(opts.mode ?? "constant");
  if (mode < 0) throw new MlxError(`pad: unknown mode ${String(opts.mode)}`);
  const [lo] = intsArg(
    "pad",
    "pad_width",
    pairs.map((p) => p[0]),
  );
  const [hi] = intsArg(
    "pad",
    "pad_width",
    pairs.map((p) => p[1]),
  );
  const axes = Int32Array.from({ length: ndim }, (_, i) => i);
  const cv = opts.constant_values ?? 0;
  // MLX does not check this when building the graph; a larger array would only fail (or misread) in eval.
  if (cv instanceof MlxArray && cv.size !== 1) {
    throw new MlxError(`pad(${a.describe()}): constant_values must be a scalar, got ${cv.describe()}`);
  }
  const v = cv instanceof MlxArray ? cv : MlxArray.scalar(cv, scalarDtype(cv, a.dtype));
  try {
    return result("pad", lib().mlxb_pad(a.handle, ndim ? axes : null, lo, hi, ndim, v.handle, mode, sh(opts.stream)), [a, JSON.stringify(pad_width)]);
  } finally {
    if (v !== cv) v.dispose();
  }
}

/** mx.repeat each element `repeats` times along `axis` (the flattened array when omitted). */
export function repeat(a: MlxArray, repeats: number, axis?: number, s?: Stream): MlxArray {
  intArg("repeat", "repeats", repeats);
  const flat = axis === undefined ? 1 : 0;
  const ax = axis === undefined ? 0 : intArg("repeat", "axis", axis);
  return result("repeat", lib().mlxb_repeat(a.handle, repeats, ax, flat, sh(s)), [a, repeats, () => `axis=${String(axis)}`]);
}

/** mx.tile */
export function tile(a: MlxArray, reps: number | readonly number[], s?: Stream): MlxArray {
  const list = typeof reps === "number" ? [reps] : reps;
  const [p, n] = intsArg("tile", "reps", list);
  return result("tile", lib().mlxb_tile(a.handle, p, n, sh(s)), [a, list]);
}

/** mx.roll: shift elements along `axis` (of the flattened array when omitted), wrapping around. */
export function roll(a: MlxArray, shift: number, axis?: number, s?: Stream): MlxArray {
  if (!Number.isInteger(shift)) throw new MlxError(`roll: shift must be an integer, got ${shift}`);
  if (axis !== undefined && !Number.isInteger(axis)) throw new MlxError(`roll: axis must be an integer, got ${axis}`);
  return result("roll", lib().mlxb_roll(a.handle, shift, axis ?? 0, axis === undefined ? 0 : 1, sh(s)), [
    a,
    () => `shift=${shift}`,
    () => `axis=${axis ?? "None"}`,
  ]);
}

// ---------------------------------------------------------------------------
// a[...] indexing

/** A Python slice `start:stop:step`; any part may be omitted (null/undefined = None). */
export interface Slice {
  readonly start?: number | null;
  readonly stop?: number | null;
  readonly step?: number | null;
}

/** `sl(1, 3)` is Python's `1:3`; `sl()` is `:`. */
export function sl(start?: number | null, stop?: number | null, step?: number | null): Slice {
  return { start, stop, step };
}

/**
 * One entry of an index: an integer, a slice (`sl(...)` or a string like ":", "1:", "::2",
 * "-1:"), `null` for a new axis (Python's None), "..." for Ellipsis, or an integer MlxArray.
 */
export type IndexEntry = number | string | null | Slice | MlxArray;

const K_INT = 0;
const K_SLICE = 1;
const K_ARRAY = 2;
const K_NONE = 3;
const K_ELLIPSIS = 4;

function parseSliceString(e: string): Slice {
  const parts = e.split(":");
  if (parts.length < 2 || parts.length > 3) throw new MlxError(`index: cannot parse "${e}" (use ":", "1:3", "::2", "..." or a number)`);
  const num = (p: string): number | null => {
    const t = p.trim();
    if (t === "") return null;
    if (!/^-?\d+$/.test(t)) throw new MlxError(`index: cannot parse "${e}": "${t}" is not an integer`);
    return Number(t);
  };
  return { start: num(parts[0]!), stop: num(parts[1]!), step: parts.length === 3 ? num(parts[2]!) : null };
}

function describeEntry(e: IndexEntry): string {
  if (e === null) return "None";
  if (e instanceof MlxArray) return e.describe();
  if (typeof e === "number") return String(e);
  if (typeof e === "string") return e;
  const p = (v: number | null | undefined) => (v === null || v === undefined ? "" : String(v));
  return `${p(e.start)}:${p(e.stop)}${e.step === null || e.step === undefined ? "" : `:${e.step}`}`;
}

/**
 * `a[...]` with MLX Python's semantics: `index(x, ":", -1)` is `x[:, -1]`, `index(x, "...", null)`
 * is `x[..., None]`, `index(w, ids)` is `w[ids]`, `index(x, ":", idx)` is `x[:, idx]`, and
 * `index(x, rows, cols)` gathers with broadcast integer arrays. One native call. A Stream may
 * follow the entries.
 */
export function index(a: MlxArray, ...args: (IndexEntry | Stream)[]): MlxArray {
  const last = args[args.length - 1];
  const stream = last instanceof Stream ? last : undefined;
  const entries = (stream ? args.slice(0, -1) : args) as IndexEntry[];
  const spec = new Int32Array(Math.max(4 * entries.length, 4));
  const arrays: MlxArray[] = [];
  entries.forEach((raw, i) => {
    let kind: number;
    let v0 = 0;
    let v1 = 0;
    let v2 = 0;
    let e: IndexEntry = raw;
    if (typeof e === "string" && e !== "...") e = parseSliceString(e);
    if (e === null) kind = K_NONE;
    else if (e === "...") kind = K_ELLIPSIS;
    else if (typeof e === "number") {
      kind = K_INT;
      v0 = intArg("index", "index", e);
    } else if (e instanceof MlxArray) {
      kind = K_ARRAY;
      v0 = arrays.length;
      arrays.push(e);
    } else if (typeof e === "object") {
      kind = K_SLICE;
      const part = (v: number | null | undefined, bit: number, name: string): number => {
        if (v === null || v === undefined) return 0;
        intArg("index", `slice ${name}`, v);
        kind |= bit;
        return v;
      };
      v0 = part(e.start, 8, "start");
      v1 = part(e.stop, 16, "stop");
      v2 = part(e.step, 32, "step");
      if (kind & 32 && v2 === 0) throw new MlxError("index: slice step cannot be zero");
    } else throw new MlxError(`index: unsupported index entry ${String(e)}`);
    spec.set([kind, v0, v1, v2], 4 * i);
  });
  const hs = arrays.length ? handleList(arrays) : null;
  return result("index", lib().mlxb_index(a.handle, entries.length ? spec : null, entries.length, hs, arrays.length, sh(stream)), [
    a,
    `[${entries.map(describeEntry).join(", ")}]`,
  ]);
}
