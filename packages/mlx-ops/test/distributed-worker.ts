// One rank of the distributed op test (distributed.test.ts starts 2 or 3 of these over the ring
// backend on loopback). Prints one JSON line of what it observed; the test checks closed forms.
import { memory, MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";

const D = mx.distributed;
const out: Record<string, unknown> = {};
const base = memory.active();
{
  using g = D.init({ strict: true, backend: "ring" });
  const r = g.rank();
  const n = g.size();
  out.rank = r;
  const inputs: MlxArray[] = [];
  const inp = (v: number[], shape: number[], dt: "float32" | "bfloat16" | "int32"): MlxArray => {
    const a = MlxArray.fromNumbers(v, shape, dt);
    inputs.push(a);
    return a;
  };
  out.size = n;
  const read = (a: MlxArray): number[] => {
    using x = a;
    return (x.tolist() as unknown[]).flat(4) as number[];
  };
  // all_sum: rank r contributes (r + 1) * [1, 2, 3]; every rank gets n(n+1)/2 * [1, 2, 3].
  out.sumF32 = read(
    D.all_sum(
      inp(
        [1, 2, 3].map((v) => v * (r + 1)),
        [3],
        "float32",
      ),
      { group: g },
    ),
  );
  out.sumBf16 = read(D.all_sum(inp([r + 1, 2 * (r + 1)], [2], "bfloat16"), { group: g }));
  out.sumI32 = read(D.all_sum(inp([r, 10 * r], [1, 2], "int32"), { group: g }));
  // all_gather: rank r contributes [[r, r]]; the result is [[0, 0], [1, 1], ...].
  out.gather = read(D.all_gather(inp([r, r], [1, 2], "int32"), { group: g }));
  out.max = read(D.all_max(inp([r, -r], [2], "float32"), { group: g }));
  out.min = read(D.all_min(inp([r, -r], [2], "float32"), { group: g }));
  // send/recv around the ring: each rank sends [r, r*r] to r+1 and receives from r-1.
  {
    const dst = (r + 1) % n;
    const src = (r + n - 1) % n;
    using x = MlxArray.fromNumbers([r, r * r], [2], "float32");
    if (r % 2 === 0) {
      using s = D.send(x, dst, { group: g });
      s.eval();
      out.recv = read(D.recv([2], "float32", src, { group: g }));
    } else {
      out.recv = read(D.recv([2], "float32", src, { group: g }));
      using s = D.send(x, dst, { group: g });
      s.eval();
    }
  }
  // split: the ring backend has no sub-groups (MLX 0.32: "[ring] Group split not supported");
  // it must be a clear error, and the group must stay usable after it.
  out.splitRing = (() => {
    try {
      g.split(r % 2).dispose();
      return "no error";
    } catch (e) {
      return (e as Error).message;
    }
  })();
  out.afterSplit = read(D.all_sum(inp([r], [1], "int32"), { group: g }));
  // Bad input is an error naming what is wrong, before anything is scheduled.
  const err = (f: () => unknown): string => {
    try {
      f();
      return "no error";
    } catch (e) {
      return (e as Error).message;
    }
  };
  using x = MlxArray.fromNumbers([1], [1], "float32");
  out.badSend = err(() => D.send(x, n, { group: g }));
  out.selfSend = err(() => D.send(x, r, { group: g }));
  out.badRecv = err(() => D.recv([1], "float32", -1, { group: g }));
  out.badSplit = err(() => g.split(-2));
  for (const a of inputs) a.dispose();
}
memory.clearCache();
out.leak = memory.active() - base;
process.stdout.write(`${JSON.stringify(out)}\n`);
