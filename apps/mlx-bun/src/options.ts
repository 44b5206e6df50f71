// Option parsing shared by the commands: every flag of mlx_lm.generate, mlx_lm.chat,
// mlx_lm.server and mlx_lm.cache_prompt with its meaning, short forms and defaults, plus ours
// where they do not collide; numbers checked at parse time.
import { Command, InvalidArgumentError, Option } from "commander";
import type { SamplingParams } from "@mlx-bun/runtime";

export function intArg(name: string, min = Number.NEGATIVE_INFINITY) {
  return (v: string): number => {
    const n = Number(v);
    if (!/^-?\d+$/.test(v.trim()) || !Number.isSafeInteger(n)) throw new InvalidArgumentError(`${name} must be an integer, got ${JSON.stringify(v)}`);
    if (n < min) throw new InvalidArgumentError(`${name} must be at least ${min}, got ${n}`);
    return n;
  };
}

export function floatArg(name: string, min = Number.NEGATIVE_INFINITY, max = Number.POSITIVE_INFINITY) {
  return (v: string): number => {
    const n = Number(v);
    if (v.trim() === "" || !Number.isFinite(n)) throw new InvalidArgumentError(`${name} must be a number, got ${JSON.stringify(v)}`);
    if (n < min || n > max) throw new InvalidArgumentError(`${name} must be in [${min}, ${max}], got ${n}`);
    return n;
  };
}

export function jsonObjectArg(name: string) {
  return (v: string): Record<string, unknown> => {
    let o: unknown;
    try {
      o = JSON.parse(v);
    } catch (e) {
      throw new InvalidArgumentError(`${name} must be a JSON object: ${(e as Error).message}`);
    }
    if (typeof o !== "object" || o === null || Array.isArray(o)) throw new InvalidArgumentError(`${name} must be a JSON object`);
    return o as Record<string, unknown>;
  };
}

/** mlx_lm's str2bool: anything but "false" / "f" (any case) is true (--verbose T / F). */
export function boolArg(v: string): boolean {
  return !["false", "f"].includes(v.toLowerCase());
}

/**
 * mlx_lm's _parse_size: a number with an optional unit M, G, MB or GB (decimal: 1G = 10^9),
 * e.g. "1073741824", "1.5G", "500MB".
 */
export function sizeArg(name: string) {
  const units: Record<string, number> = { "": 1, M: 1e6, MB: 1e6, G: 1e9, GB: 1e9 };
  return (v: string): number => {
    const m = /^(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)$/.exec(v.trim());
    const unit = m ? m[2]!.toUpperCase() : "";
    if (!m || units[unit] === undefined)
      throw new InvalidArgumentError(`${name} must be a size like 1073741824, 500M, 1.5GB (units M, MB, G, GB), got ${JSON.stringify(v)}`);
    return Math.floor(Number(m[1]) * units[unit]!);
  };
}

const LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"];
function logLevelArg(v: string): string {
  const u = v.toUpperCase();
  if (!LOG_LEVELS.includes(u)) throw new InvalidArgumentError(`--log-level must be one of ${LOG_LEVELS.join(", ")}, got ${JSON.stringify(v)}`);
  return u;
}

const KV_RE = /^(bf16|q8|q4|turbo:\d,\d)$/;
function kvArg(v: string, flag = "--kv"): string {
  if (!KV_RE.test(v)) throw new InvalidArgumentError(`${flag} must be bf16, q8, q4 or turbo:<kbits>,<vbits>, got ${JSON.stringify(v)}`);
  return v;
}

export interface ModelOptions {
  model?: string;
  /** Our KV mode (bf16 | q8 | q4 | turbo:k,v); undefined = bf16 (or, with --prompt-cache-file, the file's). */
  kv?: string;
  /** Ours: the sliding-window layers' KV mode; undefined = bf16 (the model's dtype), whatever --kv is. */
  kvSliding?: string;
  /** Ours: bound the full-attention caches to a rotating window of n tokens. */
  kvWindow?: number;
  /** mlx_lm's --max-kv-size: no effect on Gemma 4 (its make_cache wins, in mlx_lm too). */
  maxKvSize?: number;
  prefillStepSize: number;
  /** mlx_lm's --adapter-path: a LoRA adapter directory (adapter_config.json + adapters.safetensors). */
  adapterPath?: string;
  /** mlx_lm's --trust-remote-code: accepted, no effect (no remote code runs here). */
  trustRemoteCode?: boolean;
  /** mlx_lm's --kv-bits / --kv-group-size / --quantized-kv-start (generate, serve, cache-prompt). */
  kvBits?: number;
  kvGroupSize?: number;
  quantizedKvStart?: number;
  /** mlx_lm's --pipeline (chat, serve): pipeline instead of tensor parallelism across ranks. */
  pipeline?: boolean;
  /** Ours: MLX's own kernels only (no exact-order matvec or fused exact norms on CUDA sm90). */
  exact?: boolean;
}

/** Speculative decoding (mlx_lm's --draft-model, --num-draft-tokens). */
export interface DraftOptions {
  draftModel?: string;
  /** Unset: 3, or an MTP drafter's block_size - 1. */
  numDraftTokens?: number;
}

/** --draft-model, --num-draft-tokens (default 3, as mlx_lm.generate and mlx_lm.server; an MTP drafter's block_size - 1). */
export function addDraftOptions(cmd: Command): Command {
  return cmd
    .option("--draft-model <dir|repo>", "a smaller model sharing the tokenizer, or a Gemma 4 MTP drafter (gemma4_assistant), for speculative decoding")
    .option("--num-draft-tokens <n>", "tokens the drafter proposes per step (default 3; an MTP drafter's block_size - 1)", intArg("--num-draft-tokens", 1));
}

export interface SamplingOptions {
  temp: number;
  topP: number;
  topK: number;
  minP: number;
  minTokensToKeep?: number;
  xtcProbability: number;
  xtcThreshold: number;
  seed?: number;
  maxTokens: number;
}

/**
 * --model, --adapter-path, --trust-remote-code, --prefill-step-size, --max-kv-size (mlx_lm's),
 * and ours: --kv, --kv-sliding, --kv-window, --exact.
 */
export function addModelOptions(cmd: Command): Command {
  return cmd
    .option("--model <dir|repo>", "checkpoint directory or Hugging Face repo id (default: the bundled tiny model)")
    .option("--adapter-path <dir>", "a LoRA adapter (mlx_lm's adapter_config.json + adapters.safetensors)")
    .option("--trust-remote-code", "accepted for mlx_lm compatibility; no effect (mlx-bun runs no remote code)")
    .addOption(
      new Option(
        "--kv <mode>",
        "KV cache: bf16 | q8 | q4 | turbo:<kbits>,<vbits> (default bf16); a quantized mode applies to the full-attention layers, the sliding-window layers keep the model's dtype (see --kv-sliding)",
      ).argParser((v) => kvArg(v)),
    )
    .addOption(
      new Option(
        "--kv-sliding <mode>",
        "KV cache of the sliding-window layers (default: the model's dtype, as mlx-lm and mlx-vlm); e.g. --kv turbo:4,3 --kv-sliding turbo:4,3 quantizes them too (little memory saved: they hold one window of tokens; slower decoding)",
      ).argParser((v) => kvArg(v, "--kv-sliding")),
    )
    .option("--kv-window <n>", "bound the full-attention KV caches to a rotating window of n tokens", intArg("--kv-window", 1))
    .option("--max-kv-size <n>", "as mlx_lm: no effect on Gemma 4, whose own cache layout wins (see --kv-window)", intArg("--max-kv-size", 1))
    .option("--prefill-step-size <n>", "prompt tokens per prefill step", intArg("--prefill-step-size", 1), 2048)
    .option(
      "--exact",
      "decode with MLX's own kernels only, the path mlx-lm runs (on CUDA mlx-bun otherwise takes its exact-order matvec and fused norms on H100/H200, which keep MLX's bits, and its decode attention at MLX's rounding points)",
    );
}

/** mlx_lm's --kv-bits, --kv-group-size, --quantized-kv-start (generate, serve, cache-prompt). */
export function addKvQuantOptions(cmd: Command): Command {
  return cmd
    .option("--kv-bits <n>", "quantize the full-attention KV caches to n bits (affine) once they hold --quantized-kv-start tokens", intArg("--kv-bits", 1))
    .option("--kv-group-size <n>", "group size of --kv-bits", intArg("--kv-group-size", 1), 64)
    .option("--quantized-kv-start <n>", "with --kv-bits: quantize from this many tokens on", intArg("--quantized-kv-start", 0), 5000);
}

/** mlx_lm's --pipeline (chat, serve). */
export function addPipelineOption(cmd: Command): Command {
  return cmd.option(
    "--pipeline",
    "pipeline instead of tensor parallelism across `mlx-bun launch` ranks (not available: see docs/server.md); no effect in one process",
  );
}

/**
 * --max-tokens (and -m where mlx_lm has it), --temp, --top-p, --top-k, --min-p, --xtc-probability,
 * --xtc-threshold, --seed (defaults as mlx_lm).
 */
export function addSamplingOptions(cmd: Command, maxTokens: number, opts: { shortMaxTokens?: boolean; seed?: number } = {}): Command {
  return cmd
    .option(opts.shortMaxTokens ? "-m, --max-tokens <n>" : "--max-tokens <n>", "maximum tokens to generate", intArg("--max-tokens", 1), maxTokens)
    .option("--temp <t>", "sampling temperature (0 = greedy)", floatArg("--temp", 0), 0)
    .option("--top-p <p>", "nucleus sampling mass", floatArg("--top-p", 0, 1), 1)
    .option("--top-k <k>", "top-k sampling (0 = off)", intArg("--top-k", 0), 0)
    .option("--min-p <p>", "min-p sampling (0 = off)", floatArg("--min-p", 0, 1), 0)
    .option("--xtc-probability <p>", "chance per token of XTC sampling (0 = off)", floatArg("--xtc-probability", 0, 1), 0)
    .option("--xtc-threshold <t>", "XTC removes the tokens above this probability but the least likely of them", floatArg("--xtc-threshold", 0, 0.5), 0.1)
    .option("--seed <n>", "random seed", intArg("--seed"), opts.seed);
}

/** mlx_lm.server's --log-level (DEBUG, INFO: a line per request; WARNING and above: none). */
export function addLogLevelOption(cmd: Command): Command {
  return cmd.addOption(
    new Option("--log-level <level>", "DEBUG | INFO (a log line per request) | WARNING | ERROR | CRITICAL (errors only)")
      .argParser(logLevelArg)
      .default("INFO"),
  );
}

export function samplingFrom(o: SamplingOptions): SamplingParams {
  const s: SamplingParams = { temperature: o.temp, topP: o.topP, topK: o.topK, minP: o.minP };
  if (o.minTokensToKeep !== undefined && o.minTokensToKeep !== 1) s.minTokensToKeep = o.minTokensToKeep;
  if (o.xtcProbability > 0) {
    s.xtcProbability = o.xtcProbability;
    s.xtcThreshold = o.xtcThreshold;
  }
  if (o.seed !== undefined) s.seed = o.seed;
  return s;
}

/** A usage error (bad flag combination): the CLI prints the message alone, never a stack trace. */
export class UsageError extends Error {
  override name = "UsageError";
}
