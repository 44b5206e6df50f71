import { defineConfig } from "vitest/config";

// Shared by every package: tests run in forked Bun processes (bun:ffi loads there), a file at a time
// per worker; native work is CPU-heavy and the CI machine has 2 cores.
export function packageTestConfig(name: string) {
  return defineConfig({
    // Workspace packages resolve to their TypeScript sources (the "bun" export condition), not dist/.
    resolve: { conditions: ["bun"] },
    ssr: { resolve: { conditions: ["bun"], externalConditions: ["bun"] } },
    test: {
      name,
      include: ["test/**/*.test.ts"],
      pool: "forks",
      testTimeout: 120_000,
      hookTimeout: 120_000,
      // Parity tests run on MLX's own ops (the exact path), also where the fast kernels are the
      // default (CUDA sm90); the kernels' tests choose their settings explicitly.
      env: { MLX_BUN_FAST_QMV: "off", MLX_BUN_EXACT_NORMS: "off" },
    },
  });
}
