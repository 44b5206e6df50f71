// A bag of intermediate arrays freed together: the forward pass makes many per layer.
import type { MlxArray } from "@mlx-bun/mlx-ffi";

export class Scope implements Disposable {
  #owned: MlxArray[] = [];
  /** Track `a` for disposal at the end of the scope and return it. */
  t(a: MlxArray): MlxArray {
    this.#owned.push(a);
    return a;
  }
  dispose(): void {
    for (const a of this.#owned) a.dispose();
    this.#owned = [];
  }
  [Symbol.dispose](): void {
    this.dispose();
  }
}
