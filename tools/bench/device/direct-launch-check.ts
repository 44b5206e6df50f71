// Direct CUDA launches (docs/custom-kernels.md, "Direct launch") against MLX's CustomKernel path on
// a GPU: the default kernels of a 12B-shaped decode step (the exact matvec at its four shapes, the
// residual norm, the q/k/v heads with RoPE) each evaluated both ways, bit for bit; that the direct
// path ran (launches counted; a call that takes no custom kernel at its shape launches none); MLX's active memory back to where it was. Exits 1 on any difference.
//   bun tools/bench/device/direct-launch-check.ts
import { evaluate, type MlxArray, memory } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { exactDiff } from "../../oracle/compare.ts";

if (mx.kernels.gpu_backend() !== "cuda") {
  console.log("direct-launch-check: no CUDA backend here; nothing to check");
  process.exit(0);
}
mx.random.seed(3);
const bf = (shape: number[], lo = -1, hi = 1): MlxArray => {
  using u = mx.random.uniform(lo, hi, shape);
  return mx.astype(u, "bfloat16");
};
const H = 3840;
const EPS = 1e-6;

type Case = [string, () => MlxArray[]];
const held: MlxArray[] = [];
const keep = (a: MlxArray): MlxArray => {
  held.push(a);
  return a;
};
const quant = (n: number, k: number, bits: number) => {
  using w = bf([n, k], -0.05, 0.05);
  const [wq, s, b] = mx.quantize(w, { group_size: 64, bits });
  return { wq: keep(wq!), s: keep(s!), b: keep(b!) };
};
const x = keep(bf([1, 1, H]));
const xf = keep(bf([1, 1, 15360]));
const h = keep(bf([1, 1, H]));
const w1 = keep(bf([H], 0.9, 1.1));
const w2 = keep(bf([H], 0.9, 1.1));
const cases: Case[] = [];
for (const [n, k, bits] of [
  [8192, H, 4],
  [H, 4096, 4],
  [30720, H, 4],
  [H, 15360, 4],
  [H, 15360, 8],
] as const) {
  const q = quant(n, k, bits);
  const input = k === H ? x : k === 15360 ? xf : keep(bf([1, 1, k]));
  cases.push([`quantized_linear ${n}x${k} ${bits}-bit`, () => [mx.kernels.quantized_linear(input, q.wq, q.s, q.b, { group_size: 64, bits })]]);
}
cases.push(["residual_norm_exact 3840", () => mx.kernels.residual_norm_exact(h, x, w1, w2, null, EPS)]);
// The sliding layers' q/k/v heads (16 + 8 + 8 of 256) with RoPE at position 100.
const qkv = keep(bf([1, 1, 32 * 256]));
const qn = keep(bf([256], 0.9, 1.1));
const kn = keep(bf([256], 0.9, 1.1));
const pos = keep(mx.full([1], 100, "int32"));
const heads = { hq: 16, hk: 8, hv: 8, dim: 256, eps: EPS, rope: { dims: 256, base: 10000, scale: 1 } };
cases.push(["qkv_norm_exact 16+8+8 x 256, RoPE", () => mx.kernels.qkv_norm_exact(qkv, qn, kn, heads, { offset: pos })]);
evaluate(...held);

const before = memory.active();
let bad = 0;
let launched = 0;
for (const [name, run] of cases) {
  mx.kernels.set_direct_launch(false);
  const mlx = run();
  evaluate(...mlx);
  mx.kernels.set_direct_launch(true);
  const n0 = mx.kernels.direct_launches();
  const direct = run();
  evaluate(...direct);
  const ran = mx.kernels.direct_launches() - n0;
  const differ = mlx.map((a, i) => exactDiff(direct[i]!, a)).filter((d) => d !== null);
  bad += differ.length !== 0 ? 1 : 0;
  launched += ran;
  // 0 launches: the call takes no custom kernel at this shape (MLX's op on both sides).
  console.log(`${name}: ${differ.length === 0 ? "equal" : differ.join("; ")}, ${ran} direct launch(es)`);
  for (const a of [...mlx, ...direct]) a.dispose();
}
mx.kernels.set_direct_launch(undefined);
if (launched === 0) {
  console.log("no call launched directly");
  bad++;
}
const after = memory.active();
console.log(`active memory ${before} -> ${after} bytes`);
if (after > before) bad++;
for (const a of held) a.dispose();
console.log(bad === 0 ? "PASS" : `FAIL (${bad})`);
process.exit(bad === 0 ? 0 : 1);
