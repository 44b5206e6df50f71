import { MlxArray, memory } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { compile } from "../src/compile.ts";
using x = MlxArray.fromNumbers([1, 2, 3, 4], [2, 2]);
using y = MlxArray.fromNumbers([0.5, 0.25, 2, 3], [2, 2]);
const f = (a: MlxArray, b: MlxArray) => { using t = mx.multiply(a, b); return mx.exp(mx.add(t, a)); };
using cf = compile(f);
using r1 = cf(x, y);
console.log(r1.tolist(), cf.traces);
using r2 = cf(y, x);
console.log(r2.tolist(), cf.traces);
using ref = f(x, y);
console.log(ref.tolist());
const g = compile((a: MlxArray) => { throw new Error("boom"); });
try { g(x); } catch (e) { console.log("caught", String(e)); }
try { g(x); } catch (e) { console.log("caught", String(e)); }
console.log("live", memory.liveHandles());
