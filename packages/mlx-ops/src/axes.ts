// Axis and integer arguments: checked in JS, since bun:ffi would silently truncate 1.5 to 1.
import { MlxError } from "@mlx-bun/mlx-ffi";

export type Axes = number | readonly number[] | undefined;

/** Native (pointer, count) form of an axis argument; count -1 means all axes. */
export function axesArg(op: string, axes: Axes): [Int32Array | null, number] {
  if (axes === undefined) return [null, -1];
  const list = typeof axes === "number" ? [axes] : axes;
  for (const a of list) if (!Number.isInteger(a)) throw new MlxError(`${op}: axis ${a} is not an integer`);
  return [list.length ? Int32Array.from(list) : null, list.length];
}

/** Throw unless `v` is an integer within int32. */
export function intArg(op: string, name: string, v: number): number {
  if (!Number.isInteger(v) || v < -0x80000000 || v > 0x7fffffff) {
    throw new MlxError(`${op}: ${name} must be an integer, got ${String(v)}`);
  }
  return v;
}

/** A list of int32 integers as (Int32Array | null, count) for the native side. */
export function intsArg(op: string, name: string, list: readonly number[]): [Int32Array | null, number] {
  if (!Array.isArray(list)) throw new MlxError(`${op}: ${name} must be a list of integers`);
  for (const v of list) intArg(op, name, v);
  return [list.length ? Int32Array.from(list) : null, list.length];
}

/** Shape argument: non-negative integers. */
export function shapeArg(op: string, shape: readonly number[]): [Int32Array | null, number] {
  if (!Array.isArray(shape)) throw new MlxError(`${op}: shape must be a list of integers`);
  for (const d of shape) {
    if (!Number.isInteger(d) || d < 0 || d > 0x7fffffff) {
      throw new MlxError(`${op}: invalid shape [${shape.join(", ")}]: dimensions must be non-negative integers`);
    }
  }
  return [shape.length ? Int32Array.from(shape) : null, shape.length];
}

/** "[2, 3]" for error contexts. */
export function fmt(list: readonly number[]): string {
  return `[${list.join(", ")}]`;
}
