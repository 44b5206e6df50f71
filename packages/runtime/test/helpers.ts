// Shared by the runtime tests: tiny checkpoints (made once per file) and mlx-lm's generate_step.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { runPython } from "../../../tools/oracle/oracle.ts";

export const ROOT = fileURLToPath(new URL("../../..", import.meta.url));
const MAKER = join(ROOT, "tools", "make-tiny-model", "make_tiny_model.py");

export function tinyModels(variants: Record<string, string[]>): { path(name: string): string; cleanup(): void } {
  const root = mkdtempSync(join(tmpdir(), "mlxb-rt-"));
  // One Python process for all of them: starting Python and importing MLX is most of the cost.
  const argvs = Object.entries(variants).map(([name, args]) => ["--out", join(root, name), ...args]);
  const driver = `import json, sys; sys.path.insert(0, ${JSON.stringify(dirname(MAKER))}); import make_tiny_model as m\nfor a in json.loads(sys.argv[1]): m.main(a)`;
  runPython(["-c", driver, JSON.stringify(argvs)]);
  return { path: (n) => join(root, n), cleanup: () => rmSync(root, { recursive: true, force: true }) };
}

/** mlx-lm's generate_step; `processors`: its logits processors that ban fixed ids and/or every id generated so far. */
export function mlxLmGenerate(
  dir: string,
  ids: number[],
  maxTokens: number,
  prefillStep = 2048,
  processors: { ban?: number[]; noRepeat?: boolean } = {},
): { tokens: number[]; logprobs: number[] } {
  const extra = [...(processors.ban?.length ? ["--ban", processors.ban.join(",")] : []), ...(processors.noRepeat ? ["--no-repeat"] : [])];
  return JSON.parse(
    runPython([
      join(ROOT, "tools", "oracle", "generate_oracle.py"),
      dir,
      "--ids",
      ids.join(","),
      "--max-tokens",
      String(maxTokens),
      "--prefill-step",
      String(prefillStep),
      ...extra,
    ]),
  ) as { tokens: number[]; logprobs: number[] };
}

/**
 * Target/draft pairs for speculative decoding, sharing the tiny tokenizer: per variant a float32
 * target (head_dim 64 so every KV codec applies) and its 4-bit quantization as a close draft; a
 * smaller random draft (2 layers, hidden 32); a draft with another vocabulary; a target with a
 * 64-token window (and its 4-bit draft), in float32 and in bf16, for comparisons where mlx-lm's
 * window must not wrap.
 */
export function speculativePairs(variants: string[]): Record<string, string[]> {
  const base = ["--dtype", "float32", "--set", "head_dim=64"];
  const small = [
    "--variant",
    "dense",
    ...base,
    "--seed",
    "7",
    "--set",
    "num_hidden_layers=2",
    "--set",
    'layer_types=["sliding_attention","full_attention"]',
    "--set",
    "hidden_size=32",
    "--set",
    "intermediate_size=64",
  ];
  const out: Record<string, string[]> = {
    "draft-small": small,
    "draft-vocab": [...small, "--set", "vocab_size=256", "--set", "vocab_size_per_layer_input=256"],
    w64: ["--variant", "small", ...base, "--set", "sliding_window=64"],
    "w64-draft4bit": ["--variant", "small", ...base, "--set", "sliding_window=64", "--quant", "4bit"],
    "w64-bf16": ["--variant", "small", "--set", "head_dim=64", "--set", "sliding_window=64"],
    "w64-bf16-draft4bit": ["--variant", "small", "--set", "head_dim=64", "--set", "sliding_window=64", "--quant", "4bit"],
  };
  for (const v of variants) {
    out[v] = ["--variant", v, ...base];
    out[`${v}-draft4bit`] = ["--variant", v, ...base, "--quant", "4bit"];
  }
  return out;
}

/** mlx-lm's speculative tokens (and which came from the draft) and its plain greedy tokens, per [target, draft] pair, in one process. */
export function mlxLmSpeculative(
  pairs: [string, string][],
  ids: number[],
  maxTokens: number,
  numDraft: number,
): { tokens: number[]; from_draft: boolean[]; plain: number[] }[] {
  const out = JSON.parse(
    runPython([
      join(ROOT, "tools", "oracle", "speculative_oracle.py"),
      ...pairs.flat(),
      "--ids",
      ids.join(","),
      "--max-tokens",
      String(maxTokens),
      "--num-draft-tokens",
      String(numDraft),
    ]),
  ) as { tokens: number[]; from_draft: boolean[]; plain: number[] } | { tokens: number[]; from_draft: boolean[]; plain: number[] }[];
  return Array.isArray(out) ? out : [out];
}
