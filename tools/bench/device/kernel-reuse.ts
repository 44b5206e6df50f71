// The native launch path of custom kernels on a GPU (packages/mlx-ffi/native/src/ops_kernel.cpp):
// a launch whose key (stream, grid, threadgroup, template arguments, dtypes) was seen before
// reuses that call's primitive instead of having MLX write the kernel source again.
//   bun tools/bench/device/kernel-reuse.ts            check, then time both settings
//   bun tools/bench/device/kernel-reuse.ts --time     (internal) time this process's setting
// Check: turbo_values (bit-exact against its reference composition) on several inputs of one
// shape, launched one by one and together in one graph; each output must be its own input's.
// Timing: graph building per launch (no evaluation) and build + evaluation per launch, in two
// child processes, MLX_BUN_KERNEL_REUSE=0 and =1, interleaved, min / median / max.
import { spawnSync } from "node:child_process";
import { evaluate, MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { turboValuesKernel } from "../../../packages/kv-cache/src/kernels/turbo-values.ts";
import { formatSpread } from "../stats.ts";

const ROWS = 64;
const BITS = 3;
const DIM = 256;

function inputs(seed: number): MlxArray[] {
  mx.random.seed(seed);
  using raw = mx.random.randint(0, 256, [1, 2, ROWS, (DIM * BITS) / 8]);
  const packed = mx.astype(raw, "uint8");
  using u = mx.random.uniform(0.5, 2, [1, 2, ROWS, 1]);
  const scale = mx.astype(u, "bfloat16");
  const centroids = MlxArray.fromNumbers(
    Array.from({ length: 1 << BITS }, (_, i) => (i - 3.5) / 4 + seed * 1e-3),
    [1 << BITS],
    "float32",
  );
  return [packed, scale, centroids];
}

function equal(a: MlxArray, b: MlxArray): boolean {
  using e = mx.equal(a, b);
  using all = mx.all(e);
  return all.item() === 1;
}

function check(): boolean {
  if (turboValuesKernel.path() === "reference") {
    console.log("kernel-reuse: no GPU backend live here; nothing to check");
    return true;
  }
  const sets = [1, 2, 3, 4].map(inputs);
  let ok = true;
  const refs = sets.map((s) => turboValuesKernel.run(s, { path: "reference" })[0]!);
  // One by one (each evaluated before the next launch), then four launches in one graph.
  const single = sets.map((s) => {
    const [o] = turboValuesKernel.run(s);
    evaluate(o!);
    return o!;
  });
  const together = sets.map((s) => turboValuesKernel.run(s)[0]!);
  evaluate(...together);
  for (let i = 0; i < sets.length; i++) {
    const a = equal(single[i]!, refs[i]!);
    const b = equal(together[i]!, refs[i]!);
    const distinct = i === 0 || !equal(single[i]!, single[0]!);
    console.log(
      `kernel-reuse check: input ${i}: one by one ${a ? "=" : "!="} reference, in one graph ${b ? "=" : "!="} reference, ${distinct ? "distinct from input 0's" : "SAME as input 0's"}`,
    );
    ok &&= a && b && distinct;
  }
  for (const a of [...sets.flat(), ...refs, ...single, ...together]) a.dispose();
  console.log(`kernel-reuse check: ${ok ? "PASS" : "FAIL"}`);
  return ok;
}

function time(): void {
  const set = inputs(7);
  const N = 400;
  const build: number[] = [];
  const total: number[] = [];
  for (let rep = 0; rep < 7; rep++) {
    const t0 = performance.now();
    const outs = [];
    for (let i = 0; i < N; i++) outs.push(turboValuesKernel.run(set)[0]!);
    const t1 = performance.now();
    evaluate(...outs);
    const t2 = performance.now();
    for (const o of outs) o.dispose();
    if (rep === 0) continue; // the first compiles the kernel
    build.push(((t1 - t0) * 1000) / N);
    total.push(((t2 - t0) * 1000) / N);
  }
  for (const a of set) a.dispose();
  console.log(JSON.stringify({ build, total }));
}

if (process.argv.includes("--time")) {
  time();
} else {
  const ok = check();
  if (turboValuesKernel.path() !== "reference") {
    const runs: Record<string, { build: number[]; total: number[] }> = { "0": { build: [], total: [] }, "1": { build: [], total: [] } };
    for (let r = 0; r < 3; r++) {
      for (const reuse of r % 2 ? ["1", "0"] : ["0", "1"]) {
        const p = spawnSync(process.execPath, [import.meta.path, "--time"], { env: { ...process.env, MLX_BUN_KERNEL_REUSE: reuse }, encoding: "utf8" });
        const line = p.stdout.trim().split("\n").at(-1) ?? "";
        if (p.status !== 0 || !line.startsWith("{")) {
          console.log(`kernel-reuse timing (reuse ${reuse}) failed: ${p.stderr.slice(-400)}`);
          continue;
        }
        const t = JSON.parse(line) as { build: number[]; total: number[] };
        runs[reuse]!.build.push(...t.build);
        runs[reuse]!.total.push(...t.total);
      }
    }
    for (const [reuse, t] of Object.entries(runs)) {
      if (!t.build.length) continue;
      console.log(
        `kernel-reuse timing, MLX_BUN_KERNEL_REUSE=${reuse}: µs per launch (min / median / max over ${t.build.length}): graph building ${formatSpread(t.build, 1)}; building + evaluation ${formatSpread(t.total, 1)}`,
      );
    }
  }
  process.exit(ok ? 0 : 1);
}
