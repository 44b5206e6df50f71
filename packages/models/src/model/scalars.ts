// The fixed scalar operands of a forward (√hidden, the per-layer-input scales), made once per value
// and dtype and owned by the model. A number operand makes a new host-written scalar at every step;
// on CUDA, MLX keeps such scalars in one managed-memory pool whose pages each host write takes back
// from the GPU. The same value in the same dtype as mlx-ops makes for a number: the same op, the same bits.
import { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";

export class Scalars implements Disposable {
  #made = new Map<string, MlxArray>();

  /** `v` as an operand next to `like` (mlx-ops' scalarDtype), owned here: do not dispose it. */
  like(v: number, like: MlxArray): MlxArray {
    const dtype = mx.scalarDtype(v, like.dtype);
    const key = `${dtype}:${v}`;
    let a = this.#made.get(key);
    if (!a) this.#made.set(key, (a = MlxArray.scalar(v, dtype)));
    return a;
  }

  dispose(): void {
    for (const a of this.#made.values()) a.dispose();
    this.#made.clear();
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}
