// Custom kernels: path selection (pure, so every case is tested on any machine), the reference
// composition vs Python MLX, and — where a GPU backend is live — each source vs its reference.
import { describe, expect, test } from "vitest";
import { type Dtype, evaluate, Stream } from "@mlx-bun/mlx-ffi";
import { oracle } from "../../../tools/oracle/oracle.ts";
import { astype, negative } from "../src/elementwise.ts";
import * as kernels from "../src/kernels/index.ts";
import { expectClose, expectExact, expectNoLeaks, randn } from "./seeded-inputs.ts";

const { select_kernel_path, gpu_backend, kernel_environment, geglu, geglu_kernel, custom_kernel, set_direct_launch, direct_launch_enabled, direct_launches } =
  kernels;
type Env = kernels.KernelEnvironment;

describe("select_kernel_path", () => {
  const both = { name: "k", metal: { source: "m" }, cuda: { source: "c" } };
  const metalOnly = { name: "k", metal: { source: "m" } };
  const none = { name: "k" };
  const env = (gpu_backend: Env["gpu_backend"], device: Env["device"], reference_only = false): Env => ({ gpu_backend, device, reference_only });

  test("auto: a source only where its backend is live and the call runs on the GPU", () => {
    const table: [typeof both | typeof metalOnly | typeof none, Env, string][] = [
      [both, env(null, "cpu"), "reference"], // CPU-only build (this CI)
      [both, env("metal", "cpu"), "reference"], // GPU present, CPU stream
      [both, env("metal", "gpu"), "metal"],
      [both, env("cuda", "gpu"), "cuda"],
      [metalOnly, env("cuda", "gpu"), "reference"], // no source for the live backend
      [metalOnly, env("metal", "gpu"), "metal"],
      [none, env("metal", "gpu"), "reference"],
      [both, env("cuda", "gpu", true), "reference"], // MLX_BUN_KERNELS=reference
    ];
    for (const [spec, e, want] of table) expect(select_kernel_path(spec, e), JSON.stringify([spec, e])).toBe(want);
  });

  test("an explicit request runs that path or throws; never something else", () => {
    expect(select_kernel_path(both, env("cuda", "gpu"), "reference")).toBe("reference");
    expect(select_kernel_path(both, env("cuda", "gpu"), "cuda")).toBe("cuda");
    expect(() => select_kernel_path(both, env(null, "cpu"), "cuda")).toThrow(/kernel k: the cuda backend is not live here \(GPU backend: none\)/);
    expect(() => select_kernel_path(both, env("metal", "gpu"), "cuda")).toThrow(/cuda backend is not live here \(GPU backend: metal\)/);
    expect(() => select_kernel_path(both, env("cuda", "cpu"), "cuda")).toThrow(/needs a GPU stream, not cpu/);
    expect(() => select_kernel_path(metalOnly, env("cuda", "gpu"), "cuda")).toThrow(/kernel k: has no cuda source/);
  });

  test("this machine's environment", () => {
    const e = kernel_environment();
    expect(["metal", "cuda", null]).toContain(e.gpu_backend);
    using cpu = Stream.default("cpu");
    expect(kernel_environment(cpu).device).toBe("cpu");
    expect(geglu_kernel.path(cpu)).toBe("reference");
    if (gpu_backend() === null) expect(geglu_kernel.path()).toBe("reference");
  });

  test("direct launches: a switch that holds only where MLX's CUDA backend is loaded", () => {
    try {
      set_direct_launch(true);
      expect(direct_launch_enabled()).toBe(gpu_backend() === "cuda");
      set_direct_launch(false);
      expect(direct_launch_enabled()).toBe(false);
      set_direct_launch(undefined);
      expect(direct_launch_enabled()).toBe(gpu_backend() === "cuda" && !["0", "off"].includes(process.env.MLX_BUN_DIRECT_LAUNCH ?? ""));
      if (gpu_backend() !== "cuda") expect(direct_launches()).toBe(0);
      const saved = process.env.MLX_BUN_DIRECT_LAUNCH;
      process.env.MLX_BUN_DIRECT_LAUNCH = "yes";
      try {
        expect(() => direct_launch_enabled()).toThrow("MLX_BUN_DIRECT_LAUNCH=yes: expected 0, 1, on or off");
      } finally {
        if (saved === undefined) delete process.env.MLX_BUN_DIRECT_LAUNCH;
        else process.env.MLX_BUN_DIRECT_LAUNCH = saved;
      }
    } finally {
      set_direct_launch(undefined);
    }
  });
});

describe("geglu kernel", () => {
  const DTYPES: Dtype[] = ["float32", "bfloat16", "float16"];

  test("reference path equals Python's nn.gelu_approx(gate) * up, bit-exact", () => {
    const inputs = Object.fromEntries(
      DTYPES.flatMap((dt, i) => [
        [`g_${dt}`, randn([3, 5, 96], 10 + i, dt)],
        [`u_${dt}`, randn([3, 5, 96], 20 + i, dt)],
      ]),
    );
    const cases = Object.fromEntries(DTYPES.map((dt) => [dt, `__import__("mlx.nn", fromlist=["nn"]).gelu_approx(g_${dt}) * u_${dt}`]));
    using ref = oracle(inputs, cases);
    using cpu = Stream.default("cpu");
    try {
      expectNoLeaks(() => {
        for (const dt of DTYPES) {
          const [out] = geglu_kernel.run([inputs[`g_${dt}`]!, inputs[`u_${dt}`]!], { stream: cpu, path: "reference" });
          using o = out!;
          expectExact(o, ref.get(dt), `geglu reference ${dt}`);
        }
      });
    } finally {
      for (const a of Object.values(inputs)) a.dispose();
    }
  });

  test("inputs are validated before any path runs; errors name the kernel, shapes and dtypes", () => {
    using g = randn([4, 8], 1);
    using u = randn([4, 9], 2);
    using ub = randn([4, 8], 3, "bfloat16");
    expect(() => geglu(g, u)).toThrow(
      /^kernel mlxb_geglu\(array\(shape=\[4, 8\], dtype=float32\), array\(shape=\[4, 9\], dtype=float32\)\): gate and up must have the same shape/,
    );
    expect(() => geglu(g, ub)).toThrow(/same dtype/);
    expect(() => geglu_kernel.run([g])).toThrow(/expected 2 inputs \(gate, up\)/);
    if (gpu_backend() !== "cuda") expect(() => geglu_kernel.run([g, g], { path: "cuda" })).toThrow(/cuda backend is not live here/);
  });

  test("a source path reaches MLX through the native entry points (MLX refuses it on a CPU-only build)", () => {
    if (gpu_backend() !== null) return; // the GPU test below covers a live backend
    using g = randn([4, 8], 1);
    using u = randn([4, 8], 2);
    expectNoLeaks(() => {
      // Metal: the kernel object is made; the launch is refused by MLX at the call.
      expect(() => geglu_kernel.run([g, u], { environment: { gpu_backend: "metal", device: "gpu" } })).toThrow(
        /^kernel mlxb_geglu \(metal\)\(array\(shape=\[4, 8\], dtype=float32\), array\(shape=\[4, 8\], dtype=float32\)\): .*No Metal back-end/,
      );
      // CUDA: MLX refuses to make the kernel object.
      expect(() => geglu_kernel.run([g, u], { environment: { gpu_backend: "cuda", device: "gpu" } })).toThrow(/^kernel mlxb_geglu: .*No CUDA back-end/);
    });
  });

  test("runKeyed: validates and prepares a launch once per key, and runs the reference where no source runs", () => {
    let launches = 0;
    const k = custom_kernel({
      name: "keyed",
      input_names: ["a"],
      output_names: ["o"],
      metal: { source: "o[0] = a[0];" },
      validate: ([a]) => (a!.dtype === "float32" ? null : `a must be float32, got ${a!.dtype}`),
      reference: ([a]) => [negative(a!)],
      launch: ([a]) => {
        launches++;
        return { output_shapes: [a!.shape], output_dtypes: [a!.dtype], grid: [a!.size, 1, 1], threadgroup: [1, 1, 1] };
      },
    });
    using a = randn([4], 1);
    using b = randn([2], 2);
    using h = astype(a, "float16");
    // Reference path (the CPU): the same result as run, validated at every call.
    const [r] = k.runKeyed([a], "4");
    using ref = negative(a);
    expectExact(r!, ref, "runKeyed reference");
    r!.dispose();
    expect(() => k.runKeyed([h], "4")).toThrow(/^kernel keyed\(.*float16.*\): a must be float32, got float16$/);
    expect(launches).toBe(0);
    // A source path (MLX refuses the launch on a CPU-only build): the launch is computed once per key.
    const metal = { environment: { gpu_backend: "metal", device: "gpu" } as const };
    const refused = /^kernel keyed \(metal\)\(.*\): .*No Metal back-end/;
    if (gpu_backend() === null) {
      expectNoLeaks(() => {
        expect(() => k.runKeyed([a], "4", metal)).toThrow(refused);
        expect(() => k.runKeyed([a], "4", metal)).toThrow(refused);
        expect(launches).toBe(1);
        expect(() => k.runKeyed([b], "2", metal)).toThrow(refused);
        expect(launches).toBe(2);
        // A first call with a key validates: bad inputs never reach a launch or the cache.
        expect(() => k.runKeyed([h], "4h", metal)).toThrow(/a must be float32, got float16/);
        expect(() => k.runKeyed([a], "4h", metal)).toThrow(refused);
        expect(launches).toBe(3);
      });
    }
    k.dispose();
  });

  test("a kernel needs an output and identifier names", () => {
    expect(() =>
      custom_kernel({
        name: "x",
        input_names: [],
        output_names: [],
        reference: () => [],
        launch: () => ({ output_shapes: [], output_dtypes: [], grid: [1, 1, 1], threadgroup: [1, 1, 1] }),
      }),
    ).toThrow(/needs at least one output/);
    const bad = custom_kernel({
      name: "bad",
      input_names: ["a b"],
      output_names: ["o"],
      metal: { source: "" },
      reference: (xs) => [xs[0]!.retain()],
      launch: ([a]) => ({ output_shapes: [a!.shape], output_dtypes: [a!.dtype], grid: [1, 1, 1], threadgroup: [1, 1, 1] }),
    });
    using a = randn([2], 3);
    expect(() => bad.run([a], { environment: { gpu_backend: "metal", device: "gpu" } })).toThrow(/'a b' is not an identifier/);
    const [r] = bad.run([a]);
    r!.dispose();
  });

  // Both sources compute in float32 and round once, while the reference rounds after every op
  // in the input dtype (several ulps apart for half types). So a source is compared with the
  // reference evaluated on float32 copies of the inputs and rounded to the dtype: float32
  // 1e-5 relative (tanh implementations differ), half types 1 ulp (bfloat16 2^-7, float16 2^-10).
  // Seen with the CUDA source on an H200 (mlx-cuda-13 0.32.4, through tools/kernels): float32
  // within 2.4e-7, bfloat16 and float16 bit-exact.
  const TOL: Record<string, { atol: number; rtol: number }> = {
    float32: { atol: 1e-6, rtol: 1e-5 },
    bfloat16: { atol: 1e-6, rtol: 2 ** -7 },
    float16: { atol: 1e-6, rtol: 2 ** -10 },
  };
  test.skipIf(gpu_backend() === null)("on the GPU: the live backend's source equals the reference", () => {
    const backend = gpu_backend()!;
    using gpu = Stream.default("gpu");
    for (const dt of DTYPES) {
      for (const shape of [[1000], [3, 7, 129], [2, 4096], [1], [257]]) {
        using g = randn(shape, 30, dt);
        using u = randn(shape, 31, dt);
        const [k] = geglu_kernel.run([g, u], { stream: gpu, path: backend });
        using kk = k!;
        using g32 = astype(g, "float32");
        using u32 = astype(u, "float32");
        const [r] = geglu_kernel.run([g32, u32], { stream: gpu, path: "reference" });
        using r32 = r!;
        using rr = astype(r32, dt);
        expectClose(kk, rr, TOL[dt]!, `geglu ${backend} ${dt} [${shape}]`);
      }
    }
  });

  // Launches with one key share the first one's primitive (ops_kernel.cpp): each output must
  // still be computed from its own inputs, also when several are evaluated in one graph.
  test.skipIf(gpu_backend() === null)("on the GPU: launches of one shape in one graph each compute their own inputs", () => {
    const backend = gpu_backend()!;
    using gpu = Stream.default("gpu");
    const seeds = [40, 41, 42, 43];
    const gs = seeds.map((s) => randn([3, 257], s, "bfloat16"));
    const us = seeds.map((s) => randn([3, 257], s + 100, "bfloat16"));
    try {
      const outs = gs.map((g, i) => geglu_kernel.run([g, us[i]!], { stream: gpu, path: backend })[0]!);
      evaluate(...outs);
      for (let i = 0; i < seeds.length; i++) {
        using o = outs[i]!;
        const [r] = geglu_kernel.run([gs[i]!, us[i]!], { stream: gpu, path: "reference" });
        using rr = r!;
        expectClose(o, rr, TOL.bfloat16!, `geglu ${backend} launch ${i} of ${seeds.length}`);
      }
    } finally {
      for (const a of [...gs, ...us]) a.dispose();
    }
  });
});
