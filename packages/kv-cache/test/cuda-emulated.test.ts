// The CUDA bodies of the decode-attention kernels and the TurboQuant encode and un-rotation, on this CPU: each is
// compiled with g++ inside the signature MLX's cuda_kernel generates (tools/kernels/cuda_emu.h:
// threads as fibers, warp shuffles, __syncthreads) and run against its reference composition by
// tools/kernels/check_cuda_kernels.py --emulate --quick (bfloat16, contexts up to 4096; the full
// set and the H200 run are in docs/kv-cache-kernels.md). So a change to the sources' indexing, bit
// unpacking, fast or strided loads, reduce-scatter or softmax fails here, where no GPU is.
// Linux only: the emulator's fibers are ucontext.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, test } from "vitest";
import { oraclePython } from "../../../tools/oracle/oracle.ts";

const ROOT = fileURLToPath(new URL("../../..", import.meta.url));
const KERNELS = ["mlxb_turbo_decode_partials", "mlxb_affine_decode_partials", "mlxb_dense_decode_partials", "mlxb_turbo_encode_values", "mlxb_turbo_unrotate"];

describe.runIf(process.platform === "linux")("CUDA sources, emulated on the CPU", () => {
  const dir = mkdtempSync(join(tmpdir(), "mlxb-cuda-emu-"));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  test("every decode kernel (with pass 2) and the encode kernel match their references", async () => {
    const sources = join(dir, "kernel-sources.json");
    const exp = Bun.spawnSync([process.execPath, join(ROOT, "tools/kernels/export-sources.ts"), sources], { cwd: ROOT, stderr: "pipe" });
    expect(exp.exitCode, exp.stderr.toString()).toBe(0);
    // One checker a kernel, side by side (each compiles its variants with g++, then runs them).
    const runs = KERNELS.map(async (name) => {
      const p = Bun.spawn([oraclePython(), join(ROOT, "tools/kernels/check_cuda_kernels.py"), sources, "--emulate", "--quick", "--only", name], {
        cwd: ROOT,
        stdout: "pipe",
        stderr: "pipe",
      });
      const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
      return { name, out, err, code };
    });
    for (const { name, out, err, code } of await Promise.all(runs)) {
      // The lines that failed (each comparison prints its largest difference and what lies outside tolerance).
      const bad = out.split("\n").filter((l) => l.length > 0 && !/outside tolerance 0$/.test(l) && !l.startsWith("RESULT PASS"));
      expect({ name, code, bad, stderr: err.slice(-2000) }).toEqual({ name, code: 0, bad: [], stderr: err.slice(-2000) });
      expect(out).toMatch(/RESULT PASS \([1-9]\d* comparisons\)/);
    }
  }, 900_000);
});
