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

/** A `mlx-bun serve` process started by startServe: its URL, its start-up stderr, and stop(). */
export interface ServeProcess {
  url: string;
  startup: string;
  stop(): Promise<void>;
}

/** Start `bun cli.ts serve ...args --port 0 --no-web` and wait for its "listening on" line. */
export async function startServe(args: string[], timeoutMs = 60_000): Promise<ServeProcess> {
  const p = Bun.spawn([BUN, CLI, "serve", ...args, "--port", "0", "--no-web"], {
    cwd: ROOT,
    env: { ...process.env, NO_COLOR: "1" },
    stdout: "ignore",
    stderr: "pipe",
  });
  const reader = p.stderr.getReader();
  let err = "";
  const deadline = Date.now() + timeoutMs;
  let found: string | undefined;
  while (!found && Date.now() < deadline) {
    const { value, done } = await reader.read();
    if (done) break;
    err += new TextDecoder().decode(value);
    found = /listening on (http:\/\/\S+).*\n/.exec(err)?.[1];
  }
  reader.releaseLock();
  const stop = async () => {
    if (p.exitCode === null) {
      p.kill("SIGINT");
      await p.exited;
    }
  };
  if (!found) {
    await stop();
    throw new Error(`serve ${args.join(" ")} did not start:\n${err}`);
  }
  return { url: found, startup: err, stop };
}
