// Open a checkpoint directory: config, lazily loaded weights, the model, tokenizer and chat template.
import { createHash, type Hash } from "node:crypto";
import { closeSync, fstatSync, openSync, readSync } from "node:fs";
import { basename } from "node:path";
import { ChatTemplate, NoChatTemplateError } from "./chat-template.ts";
import { type Gemma4Config, loadGemma4Config } from "./config.ts";
import { Gemma4Model } from "./model/gemma4.ts";
import { Gemma4Tokenizer } from "./tokenizer.ts";
import { parseVisionConfig } from "./vision/tower.ts";
import { parseUnifiedVisionConfig } from "./vision/unified.ts";
import { type LoadedWeights, loadWeights, MULTIMODAL_DROP_REASON } from "./weights.ts";

/** Everything generation needs from one checkpoint. Dispose it to free the weights. */
export interface LoadedModel extends Disposable {
  dir: string;
  config: Gemma4Config;
  model: Gemma4Model;
  tokenizer: Gemma4Tokenizer;
  /** null when the checkpoint has no chat template. */
  template: ChatTemplate | null;
  /**
   * Identifies the architecture and the weights: config, tensor names/shapes/dtypes, and per
   * weight file its size, header bytes and a few sampled 4 KiB blocks of data (see
   * `hashWeightFile`), so a KV snapshot of another model, same-shaped checkpoints included, is
   * refused. Costs a few small reads per file, never a read of the whole model.
   */
  fingerprint: string;
  weights: LoadedWeights;
  /** Problems found while loading that were worked around, one sentence each (the CLI prints them at start-up). */
  warnings?: string[];
  dispose(): void;
}

/**
 * A checkpoint's config, tokenizer and chat template (null when it has none), without its weights.
 * A chat template that exists but does not parse is an error here (ConfigError naming the file and
 * the parse error), not a checkpoint without a template: that would silently build other prompts.
 */
export function loadTextSide(dir: string): { config: Gemma4Config; tokenizer: Gemma4Tokenizer; template: ChatTemplate | null; warnings: string[] } {
  const config = loadGemma4Config(dir);
  const tokenizer = Gemma4Tokenizer.load(dir);
  let template: ChatTemplate | null = null;
  try {
    template = ChatTemplate.load(dir, tokenizer);
  } catch (e) {
    if (!(e instanceof NoChatTemplateError)) throw e;
    template = null;
  }
  return { config, tokenizer, template, warnings: [...tokenizer.warnings] };
}

/** What a multimodal checkpoint's skipped vision tensors mean for image input. */
function imageNote(config: Gemma4Config): string {
  try {
    if (parseVisionConfig(config)) return "the vision tower loads with the first image";
    if (parseUnifiedVisionConfig(config)) return "the vision embedder loads with the first image";
    return "config.json has no vision_config, so images are not taken";
  } catch (e) {
    return `image input is not available: ${(e as Error).message}`;
  }
}

/**
 * Load a checkpoint from a local directory (weights stay lazy until first use). Only the text side
 * loads: the vision and audio towers of a multimodal checkpoint (gemma4, gemma4_unified) are
 * skipped by name, and a warning says how many tensors that was.
 */
export function loadModel(dir: string): LoadedModel {
  const { config, tokenizer, template, warnings } = loadTextSide(dir);
  const weights = loadWeights(dir, config);
  const towers = weights.plan.dropped.filter((d) => d.reason === MULTIMODAL_DROP_REASON);
  if (towers.length) {
    const kinds = [...new Set(towers.map((d) => d.name.replace(/^model\./, "").split(".")[0]!))].sort();
    warnings.push(
      `text only: ${towers.length} vision/audio tensors (${kinds.join(", ")}) are not loaded with the text side; ${imageNote(config)}; audio input is not supported`,
    );
  }
  let model: Gemma4Model;
  try {
    model = new Gemma4Model(config, weights.tensors);
  } catch (e) {
    weights.dispose();
    throw e;
  }
  let fingerprint: string;
  try {
    const h = createHash("sha256").update(JSON.stringify(config.raw));
    for (const [name, a] of [...weights.tensors].sort(([a], [b]) => (a < b ? -1 : 1))) h.update(`${name}:${a.dtype}:${a.shape.join("x")};`);
    for (const f of [...weights.files.files].sort()) hashWeightFile(h, f);
    fingerprint = h.digest("hex").slice(0, 32);
  } catch (e) {
    model.dispose();
    weights.dispose();
    throw e;
  }
  const dispose = (): void => {
    model.dispose();
    weights.dispose();
  };
  return { dir, config, model, tokenizer, template, fingerprint, weights, warnings, dispose, [Symbol.dispose]: dispose };
}

/** Blocks sampled from each weight file's data section by the fingerprint. */
export const FINGERPRINT_SAMPLES = 8;
const BLOCK = 4096;

/**
 * Feed one safetensors file into a fingerprint: its name and size, the raw header (tensor
 * names, dtypes, offsets, metadata) and FINGERPRINT_SAMPLES blocks of 4 KiB spread evenly over
 * the data section (first and last included). Two checkpoints of the same architecture but
 * different weights differ in their sampled bytes; the file is never read whole.
 */
export function hashWeightFile(h: Hash, file: string): void {
  const fd = openSync(file, "r");
  try {
    const size = fstatSync(fd).size;
    h.update(`file:${basename(file)}:${size};`);
    const len = Buffer.alloc(8);
    if (size < 8 || readSync(fd, len, 0, 8, 0) !== 8) return;
    const headerLen = Math.min(Number(len.readBigUInt64LE(0)), Math.max(0, size - 8));
    const header = Buffer.alloc(headerLen);
    readSync(fd, header, 0, headerLen, 8);
    h.update(header);
    const start = 8 + headerLen;
    const span = size - start;
    if (span <= 0) return;
    const block = Buffer.alloc(Math.min(BLOCK, span));
    const last = span - block.length;
    for (let i = 0; i < FINGERPRINT_SAMPLES; i++) {
      const at = start + Math.floor((last * i) / (FINGERPRINT_SAMPLES - 1));
      const n = readSync(fd, block, 0, block.length, at);
      h.update(block.subarray(0, n));
    }
  } finally {
    closeSync(fd);
  }
}
