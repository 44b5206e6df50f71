// Shared by the runtime tests: tiny checkpoints (made once per file) and mlx-lm's generate_step.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { runPython } from "../../../tools/oracle/oracle.ts";

export const ROOT = fileURLToPath(new URL("../../..", import.meta.url));
const MAKER = join(ROOT, "tools", "make-tiny-model", "make_tiny_model.py");

export function tinyModels(variants: Record<string, string[]>): { path(name: string): string; cleanup(): void } {
  const root = mkdtempSync(join(tmpdir(), "mlxb-rt-"));
  for (const [name, args] of Object.entries(variants)) runPython([MAKER, "--out", join(root, name), ...args]);
  return { path: (n) => join(root, n), cleanup: () => rmSync(root, { recursive: true, force: true }) };
}

export function mlxLmGenerate(dir: string, ids: number[], maxTokens: number, prefillStep = 2048): { tokens: number[]; logprobs: number[] } {
  return JSON.parse(
    runPython([join(ROOT, "tools", "oracle", "generate_oracle.py"), dir, "--ids", ids.join(","), "--max-tokens", String(maxTokens), "--prefill-step", String(prefillStep)]),
  ) as { tokens: number[]; logprobs: number[] };
}
