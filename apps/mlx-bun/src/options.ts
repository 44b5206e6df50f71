// Option parsing shared by the commands: numbers checked at parse time, named like mlx_lm's flags.
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

const KV_RE = /^(bf16|q8|q4|turbo:\d,\d)$/;
function kvArg(v: string): string {
  if (!KV_RE.test(v)) throw new InvalidArgumentError(`--kv must be bf16, q8, q4 or turbo:<kbits>,<vbits>, got ${JSON.stringify(v)}`);
  return v;
}

export interface ModelOptions {
  model?: string;
  kv: string;
  maxKvSize?: number;
  prefillStepSize: number;
}

/** Speculative decoding (mlx_lm's --draft-model, --num-draft-tokens). */
export interface DraftOptions {
  draftModel?: string;
  numDraftTokens: number;
}

/** --draft-model, --num-draft-tokens (default 3, as mlx_lm.generate and mlx_lm.server). */
export function addDraftOptions(cmd: Command): Command {
  return cmd
    .option("--draft-model <dir|repo>", "a smaller model sharing the tokenizer, for speculative decoding")
    .option("--num-draft-tokens <n>", "tokens the draft model proposes per step (speculative decoding)", intArg("--num-draft-tokens", 1), 3);
}

export interface SamplingOptions {
  temp: number;
  topP: number;
  topK: number;
  minP: number;
  xtcProbability: number;
  xtcThreshold: number;
  seed?: number;
  maxTokens: number;
}

/** --model, --kv, --max-kv-size, --prefill-step-size. */
export function addModelOptions(cmd: Command): Command {
  return cmd
    .option("-m, --model <dir|repo>", "checkpoint directory or Hugging Face repo id (default: the bundled tiny model)")
    .addOption(new Option("--kv <mode>", "KV cache: bf16 | q8 | q4 | turbo:<kbits>,<vbits>").default("bf16").argParser(kvArg))
    .option("--max-kv-size <n>", "bound the KV cache to a rotating window of n tokens", intArg("--max-kv-size", 1))
    .option("--prefill-step-size <n>", "prompt tokens per prefill step", intArg("--prefill-step-size", 1), 2048);
}

/** --temp, --top-p, --top-k, --min-p, --xtc-probability, --xtc-threshold, --seed, --max-tokens (defaults as mlx_lm). */
export function addSamplingOptions(cmd: Command, maxTokens: number): Command {
  return cmd
    .option("--max-tokens <n>", "maximum tokens to generate", intArg("--max-tokens", 1), maxTokens)
    .option("--temp <t>", "sampling temperature (0 = greedy)", floatArg("--temp", 0), 0)
    .option("--top-p <p>", "nucleus sampling mass", floatArg("--top-p", 0, 1), 1)
    .option("--top-k <k>", "top-k sampling (0 = off)", intArg("--top-k", 0), 0)
    .option("--min-p <p>", "min-p sampling (0 = off)", floatArg("--min-p", 0, 1), 0)
    .option("--xtc-probability <p>", "chance per token of XTC sampling (0 = off)", floatArg("--xtc-probability", 0, 1), 0)
    .option("--xtc-threshold <t>", "XTC removes the tokens above this probability but the least likely of them", floatArg("--xtc-threshold", 0, 0.5), 0.1)
    .option("--seed <n>", "random seed", intArg("--seed"));
}

export function samplingFrom(o: SamplingOptions): SamplingParams {
  const s: SamplingParams = { temperature: o.temp, topP: o.topP, topK: o.topK, minP: o.minP };
  if (o.xtcProbability > 0) {
    s.xtcProbability = o.xtcProbability;
    s.xtcThreshold = o.xtcThreshold;
  }
  if (o.seed !== undefined) s.seed = o.seed;
  return s;
}
