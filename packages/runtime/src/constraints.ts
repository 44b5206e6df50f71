// Token constraints as logits processors: ids a request may never produce (e.g. the tool-call
// start under tool_choice "none").
import { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import type { LogitsProcessor } from "./types.ts";

/** logits[:, ids] = -inf on a [1, V] row (as Python's `logits[:, ids] = -inf`). */
export function maskIds(logits: MlxArray, ids: Iterable<number>): MlxArray {
  const V = logits.shape[logits.ndim - 1]!;
  const mask = new Uint8Array(V);
  for (const i of ids) if (i >= 0 && i < V) mask[i] = 1;
  using m = MlxArray.fromTypedArray(mask, [1, V], "bool");
  return mx.where(m, Number.NEGATIVE_INFINITY, logits);
}

/** A processor that bans `ids` at every step (history-free: the row stays pipelined). */
export function banTokens(ids: readonly number[]): LogitsProcessor {
  const banned = [...ids];
  return { readsHistory: false, process: (_history, logits) => maskIds(logits, banned) };
}
