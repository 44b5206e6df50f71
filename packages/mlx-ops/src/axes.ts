// Axis arguments: a number, a list, or undefined for all axes.
import { MlxError } from "@mlx-bun/mlx-ffi";

export type Axes = number | readonly number[] | undefined;

/** Native (pointer, count) form of an axis argument; count -1 means all axes. */
export function axesArg(op: string, axes: Axes): [Int32Array | null, number] {
  if (axes === undefined) return [null, -1];
  const list = typeof axes === "number" ? [axes] : axes;
  for (const a of list) if (!Number.isInteger(a)) throw new MlxError(`${op}: axis ${a} is not an integer`);
  return [list.length ? Int32Array.from(list) : null, list.length];
}
