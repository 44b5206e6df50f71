// Shared by the app's tests: paths, tiny checkpoints, the CLI as a subprocess.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { runPython } from "../../../tools/oracle/oracle.ts";

export const ROOT = fileURLToPath(new URL("../../..", import.meta.url));
export const CLI = join(ROOT, "apps", "mlx-bun", "src", "cli.ts");
export const MAKER = join(ROOT, "tools", "make-tiny-model", "make_tiny_model.py");
export const BUN = process.execPath;

export function tempDir(prefix: string): { path: string; cleanup(): void } {
  const path = mkdtempSync(join(tmpdir(), prefix));
  return { path, cleanup: () => rmSync(path, { recursive: true, force: true }) };
}

/** make_tiny_model.py --variant small (a Gemma 4 E2B-like checkpoint, ~0.8 MB) into `out`. */
export function makeTinySmall(out: string, extra: string[] = []): string {
  runPython([MAKER, "--variant", "small", "--out", out, ...extra]);
  return out;
}

export interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** Run `bun cli.ts ...args` and wait for it. */
export async function runCli(args: string[], opts: { env?: Record<string, string>; stdin?: string; timeoutMs?: number } = {}): Promise<CliResult> {
  const p = Bun.spawn([BUN, CLI, ...args], {
    cwd: ROOT,
    env: { ...process.env, NO_COLOR: "1", ...opts.env },
    stdin: opts.stdin !== undefined ? new TextEncoder().encode(opts.stdin) : "ignore",
    stdout: "pipe",
    stderr: "pipe",
  });
  const timer = setTimeout(() => p.kill(), opts.timeoutMs ?? 60_000);
  const [stdout, stderr, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  clearTimeout(timer);
  return { code, stdout, stderr };
}
