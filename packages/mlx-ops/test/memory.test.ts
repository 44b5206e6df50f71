import { describe, expect, test } from "vitest";
import { evaluate, type MlxArray, memory, Stream } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";

// One pass over the op surface: creation, random, elementwise with scalars, reductions, shape,
// split (several outputs), indexing, matmul; plus failing calls (their temporaries must be freed too).
function workload(): void {
  const live: MlxArray[] = [];
  const keep = (a: MlxArray): MlxArray => (live.push(a), a);
  try {
    const k = keep(mx.random.key(1));
    const x = keep(mx.random.normal([16, 32], { key: k, dtype: "bfloat16" }));
    const w = keep(mx.random.uniform(-0.1, 0.1, [32, 8], { key: k, dtype: "bfloat16" }));
    const h = keep(mx.matmul(x, w));
    const g = keep(mx.gelu_approx(keep(mx.multiply(keep(mx.add(h, 1)), 0.5))));
    const parts = mx.split(g, 4, 1).map(keep);
    const cat = keep(mx.concatenate(parts, 0));
    const sm = keep(mx.softmax(cat, -1, { precise: true }));
    const top = keep(mx.topk(sm, 2));
    const am = keep(mx.argmax(sm, -1));
    const idx = keep(mx.index(sm, "...", -1));
    const gathered = keep(mx.index(x, am));
    const upd = keep(mx.slice_update(keep(mx.zeros([32, 8], "bfloat16")), keep(mx.ones([2, 8], "bfloat16")), [0, 0], [2, 8]));
    const cs = keep(mx.cumsum(keep(mx.arange(100)), 0, { reverse: true }));
    const padded = keep(
      mx.pad(
        upd,
        [
          [1, 1],
          [0, 0],
        ],
        { constant_values: -1 },
      ),
    );
    const wh = keep(mx.where(keep(mx.greater(padded, 0)), padded, 0));
    const cat2 = keep(mx.random.categorical(h, { key: k, num_samples: 3 }));
    evaluate(
      top,
      am,
      idx,
      gathered,
      cs,
      wh,
      cat2,
      keep(mx.var(x, -1, { ddof: 1 })),
      keep(mx.tri(8)),
      keep(
        mx.array([
          [1, 2],
          [3, 4],
        ]),
      ),
    );
    // failing calls: weak scalars made for them are disposed, nothing else made
    expect(() => mx.add(x, keep(mx.zeros([3])))).toThrow();
    expect(() => mx.where(keep(mx.zeros([3], "bool")), x, 0)).toThrow();
    expect(() => mx.clip(keep(mx.zeros([2])), 0, keep(mx.zeros([3])))).toThrow();
    expect(() => mx.pad(x, 1, { constant_values: keep(mx.zeros([5])) })).toThrow();
    expect(() => mx.random.uniform(0, keep(mx.zeros([3])), [2], { key: k })).toThrow();
    expect(() => mx.split(x, 5, 1)).toThrow();
  } finally {
    for (const a of live) a.dispose();
  }
}

describe("memory", () => {
  test("an op workload leaves MLX active memory and live handles at baseline after disposal", () => {
    workload(); // warm up allocator, caches and FFI bindings
    memory.clearCache();
    const baseMem = memory.active();
    const baseHandles = memory.liveHandles();
    for (let i = 0; i < 20; i++) workload();
    expect(memory.liveHandles()).toBe(baseHandles);
    expect(memory.active()).toBe(baseMem);
  });
});

describe("streams", () => {
  test("ops take an explicit stream (last argument or options.stream)", () => {
    using s = Stream.default("cpu");
    using a = mx.arange(6, { dtype: "float32", stream: s });
    using b = mx.reshape(a, [2, 3], s);
    using c = mx.add(b, 1, s);
    using d = mx.sum(c, 1, { stream: s, keepdims: true });
    using e = mx.index(c, ":", -1, s);
    using k = mx.random.key(0);
    using r = mx.random.normal([2], { key: k, stream: s });
    const parts = mx.split(c, 3, 1, s);
    evaluate(d, e, r, ...parts);
    expect(d.tolist()).toEqual([[6], [15]]);
    expect(e.tolist()).toEqual([3, 6]);
    expect(parts.map((p) => p.shape)).toEqual([
      [2, 1],
      [2, 1],
      [2, 1],
    ]);
    for (const p of parts) p.dispose();
  });
});
