// Shared by the test files: the tiny checkpoints (made once per file) and the Python reference.
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { runPython } from "../../../tools/oracle/oracle.ts";

export const ROOT = fileURLToPath(new URL("../../..", import.meta.url));
export const MAKER = join(ROOT, "tools", "make-tiny-model", "make_tiny_model.py");
const REFERENCE = join(ROOT, "tools", "oracle", "gemma4_reference.py");

/** Names of the checkpoints `make_tiny_model.py --suite` writes. */
export const SUITE = ["small-bf16", "small-4bit", "dense-bf16", "dense-mixed", "moe-bf16", "moe-f32", "moe-4bit"] as const;
export type SuiteName = (typeof SUITE)[number];

export interface TinySuite {
  root: string;
  path(name: SuiteName): string;
  cleanup(): void;
}

/** Write the standard tiny checkpoints into a fresh temp dir. */
export function makeSuite(): TinySuite {
  const root = mkdtempSync(join(tmpdir(), "mlxb-tiny-gemma4-"));
  runPython([MAKER, "--suite", root]);
  return { root, path: (n) => join(root, n), cleanup: () => rmSync(root, { recursive: true, force: true }) };
}

/** Make one checkpoint with make_tiny_model.py options. */
export function makeTiny(out: string, args: string[]): string {
  runPython([MAKER, "--out", out, ...args]);
  return out;
}

/** Run a gemma4_reference.py subcommand; `input` (if given) is written to a temp JSON file passed last. */
export function reference<T = any>(cmd: string, args: string[], input?: unknown): T {
  let tmp: string | undefined;
  try {
    if (input !== undefined) {
      tmp = mkdtempSync(join(tmpdir(), "mlxb-ref-"));
      const f = join(tmp, "in.json");
      writeFileSync(f, JSON.stringify(input));
      args = [...args, f];
    }
    return JSON.parse(runPython([REFERENCE, cmd, ...args])) as T;
  } finally {
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  }
}
