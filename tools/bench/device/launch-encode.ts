// What MLX's encode (the asyncEval call) costs per op of a decode step, on the 12B-shaped model's
// shapes (issue 20: a default 12B step's 731 launches take 10-12 ms of encode on an H100's host,
// ~14 µs each). For each op: N calls built (graph building, µs a call), then encoded by one
// asyncEval (µs a call), then waited for. Calls are independent (same inputs, N outputs) except
// the KV write, a chain as in a cache (each update donates the buffer it wrote).
//   bun tools/bench/device/launch-encode.ts [--calls 400] [--reps 5] [--only a,b]
// Ops interleave with a rotating order; min / median / max over the repetitions.
import { asyncEval, evaluate, MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { formatSpread } from "../stats.ts";

const arg = (name: string): string | undefined => {
  const i = process.argv.indexOf(name);
  return i > 0 ? process.argv[i + 1] : undefined;
};
const N = Number(arg("--calls") ?? 400);
const REPS = Number(arg("--reps") ?? 5);
const only = arg("--only")?.split(",");
const H = 3840; // hidden
const F = 15360; // feed-forward
const L = 512; // keys in the cache
const EPS = 1e-6;

// Two custom kernels of one body (y·w), one with ~10 KB of comments in its header: MLX hashes
// the whole source at every launch to find its module.
const body = `
  const int e = (int)(blockIdx.x * blockDim.x + threadIdx.x);
  if (e < A) out[e] = __hmul_rn(x[e], w[e]);
`;
const scaleKernel = (name: string, header: string): mx.kernels.CustomKernel =>
  mx.kernels.custom_kernel({
    name,
    input_names: ["x", "w"],
    output_names: ["out"],
    cuda: { source: body, header, direct: true },
    reference: ([x, w], s) => [mx.multiply(x!, w!, s)],
    launch: ([x]) => ({ output_shapes: [x!.shape], output_dtypes: ["bfloat16"], grid: [H, 1, 1], threadgroup: [256, 1, 1], template: [["A", H]] }),
  });
const padding = `${Array.from({ length: 130 }, (_, i) => `// padding line ${i}: MLX hashes the kernel source, comments included, at every launch.`).join("\n")}\n`;
const small = scaleKernel("mlxb_launch_small", "");
const large = scaleKernel("mlxb_launch_large", padding);

mx.random.seed(1);
const bf = (shape: number[], lo = -1, hi = 1): MlxArray => {
  using u = mx.random.uniform(lo, hi, shape);
  return mx.astype(u, "bfloat16");
};
const y = bf([1, 1, H]);
const h = bf([1, 1, H]);
const w = bf([H], 0.9, 1.1);
const w2 = bf([H], 0.9, 1.1);
const wBig = bf([H, H], -0.05, 0.05);
const [wq, sc, bi] = mx.quantize(wBig, { group_size: 64, bits: 4 });
// Attention as MLX's sdpa fallback issues it for a decode row: 16 query heads over 8 KV heads,
// queries [B, Hkv, repeats, 1, D] against keys and values broadcast over the repeats.
const q = bf([1, 8, 2, 1, 256]);
const k = bf([1, 8, 1, L, 256]);
const kT = mx.swapaxes(k, -1, -2);
const v = bf([1, 8, 1, L, 256]);
const p = bf([1, 8, 2, 1, L], 0, 0.01);
const q4 = bf([1, 16, 1, 256]);
const k4 = bf([1, 8, L, 256]);
const gate = bf([1, 1, F]);
const up = bf([1, 1, F]);
const upd = bf([1, 8, 1, 256]);
const cache0 = bf([1, 8, 1024, 256]);
evaluate(y, h, w, w2, wq, sc, bi!, q, k, kT, v, p, q4, k4, gate, up, upd, cache0);
const geglu = mx.compile(
  (g: MlxArray, u: MlxArray) => {
    using a = mx.gelu_approx(g);
    return mx.multiply(a, u);
  },
  { shapeless: true },
);
const pos = MlxArray.scalar(100, "int32");

/** `f` built with direct launches (docs/custom-kernels.md, "Direct launch"): MLX's kernel without its per-launch source hashing. */
const direct =
  <T>(f: () => T) =>
  (): T => {
    mx.kernels.set_direct_launch(true);
    try {
      return f();
    } finally {
      mx.kernels.set_direct_launch(false);
    }
  };

/** An op: N calls; `chain` ops take the previous output as their first input. */
interface Op {
  call: (prev: MlxArray | null) => MlxArray | MlxArray[];
  chain?: boolean;
}
mx.kernels.set_direct_launch(false);
const ops: Record<string, Op> = {
  "rms_norm (MLX)": { call: () => mx.fast.rms_norm(y, w, EPS) },
  "custom y·w, 0.4 KB source": { call: () => small.run([y, w])[0]! },
  "custom y·w, 10 KB source": { call: () => large.run([y, w])[0]! },
  "custom y·w, 0.4 KB source, direct": { call: direct(() => small.run([y, w])[0]!) },
  "custom y·w, 10 KB source, direct": { call: direct(() => large.run([y, w])[0]!) },
  "residual_norm_exact (custom)": { call: () => mx.kernels.residual_norm_exact(h, y, w, w2, null, EPS) },
  "residual_norm_exact, direct": { call: direct(() => mx.kernels.residual_norm_exact(h, y, w, w2, null, EPS)) },
  "quantized_matmul 3840² (MLX)": { call: () => mx.quantized_matmul(y, wq!, sc!, bi, { group_size: 64, bits: 4, transpose: true }) },
  "quantized_linear 3840² (default)": { call: () => mx.kernels.quantized_linear(y, wq!, sc!, bi, { group_size: 64, bits: 4 }) },
  "quantized_linear 3840², direct": { call: direct(() => mx.kernels.quantized_linear(y, wq!, sc!, bi, { group_size: 64, bits: 4 })) },
  "q·kᵀ matmul (gemv_batched, 5-D)": { call: () => mx.matmul(q, kT) },
  "p·v matmul (cuBLAS pointer batch, 5-D)": { call: () => mx.matmul(p, v) },
  "softmax precise": { call: () => mx.softmax(p, [-1], { precise: true }) },
  "sdpa decode (MLX: the four above)": { call: () => mx.fast.scaled_dot_product_attention(q4, k4, k4, { scale: 1, mask: null }) },
  "geglu (compiled)": { call: () => geglu(gate, up) },
  "KV write (slice_update, donated)": { call: (prev) => mx.slice_update(prev ?? cache0, upd, pos, [2]), chain: true },
};

/** N calls of `op`: [build, encode, wait] in µs a call. */
function run(op: Op): [number, number, number] {
  const outs: MlxArray[] = [];
  const a = performance.now();
  let prev: MlxArray | null = null;
  for (let i = 0; i < N; i++) {
    const r = op.call(prev);
    const arr = Array.isArray(r) ? r : [r];
    if (op.chain) {
      if (prev) prev.dispose();
      prev = arr[0]!;
    } else outs.push(...arr);
  }
  if (prev) outs.push(prev);
  const b = performance.now();
  asyncEval(...outs);
  const c = performance.now();
  evaluate(...outs);
  const d = performance.now();
  for (const o of outs) o.dispose();
  return [((b - a) * 1000) / N, ((c - b) * 1000) / N, ((d - c) * 1000) / N];
}

const names = Object.keys(ops).filter((n) => !only || only.some((o) => n.includes(o)));
// An op that fails (a path not available on this machine) is reported and left out, not fatal.
const failed = new Map<string, string>();
for (const n of names) {
  try {
    run(ops[n]!); // warm-up: NVRTC compiles, allocator, graph cache
  } catch (e) {
    failed.set(n, String(e).split("\n")[0]!);
  }
}
const live = names.filter((n) => !failed.has(n));
const times: Record<string, [number[], number[], number[]]> = Object.fromEntries(live.map((n) => [n, [[], [], []]]));
for (let r = 0; r < REPS; r++) {
  for (let j = 0; j < live.length; j++) {
    const n = live[(r + j) % live.length]!;
    const t = run(ops[n]!);
    for (let k = 0; k < 3; k++) times[n]![k]!.push(t[k]!);
  }
}
console.log(`| op (${N} calls, ${REPS} reps), µs a call | build | encode (asyncEval) | wait |`);
console.log("| --- | --- | --- | --- |");
for (const n of names)
  console.log(failed.has(n) ? `| ${n} | failed: ${failed.get(n)} | | |` : `| ${n} | ${times[n]!.map((xs) => formatSpread(xs)).join(" | ")} |`);
