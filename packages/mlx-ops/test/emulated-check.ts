// Runs kernels' CUDA bodies on this CPU for the kernel tests: export the sources
// (tools/kernels/export-sources.ts), then tools/kernels/check_cuda_kernels.py --emulate (cuda_emu.h).
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { expect } from "vitest";
import { oraclePython } from "../../../tools/oracle/oracle.ts";

const ROOT = fileURLToPath(new URL("../../..", import.meta.url));

/** Every kernel's sources as kernel-sources.json in `dir`; its path. */
export function exportKernelSources(dir: string): string {
  const sources = join(dir, "kernel-sources.json");
  const exp = Bun.spawnSync([process.execPath, join(ROOT, "tools/kernels/export-sources.ts"), sources], { cwd: ROOT, stderr: "pipe" });
  expect(exp.exitCode, exp.stderr.toString()).toBe(0);
  return sources;
}

/** The checker's exit code, stdout and the tail of its stderr for the kernels `only` (comma-separated) of `sources`. */
export function emulatedCheck(sources: string, only: string): { code: number; out: string; stderr: string } {
  const r = Bun.spawnSync([oraclePython(), join(ROOT, "tools/kernels/check_cuda_kernels.py"), sources, "--emulate", "--only", only], {
    cwd: ROOT,
    stdout: "pipe",
    stderr: "pipe",
  });
  return { code: r.exitCode ?? -1, out: r.stdout.toString(), stderr: r.stderr.toString().slice(-2000) };
}
