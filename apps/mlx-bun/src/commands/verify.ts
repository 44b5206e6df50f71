// mlx-bun verify <path>: check a KV snapshot (ours or mlx-lm's prompt cache) or a checkpoint
// (a directory, or one .safetensors weight file) without generating anything.
import { existsSync, lstatSync, statSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import { readSafetensorsHeader, type SafetensorsHeader } from "@mlx-bun/mlx-ffi";
import { findWeights, loadGemma4Config, loadModel } from "@mlx-bun/models";
import { KvStoreError, verifyPromptCache } from "@mlx-bun/runtime";
import { UsageError } from "../options.ts";

export interface VerifyOptions {
  json?: boolean;
}

/** A failed check: the CLI prints the message alone and exits 1. */
export class VerifyError extends Error {
  override name = "VerifyError";
}

interface Report {
  path: string;
  kind: "kv-snapshot" | "mlx-lm-prompt-cache" | "checkpoint" | "safetensors";
  ok: boolean;
  checks: string[];
  notes: string[];
}

/**
 * The data section of one safetensors file: tensors must neither overlap nor leave holes, and
 * the file must end where the last tensor does (the header parser already checked every tensor's
 * byte size against its dtype and shape, and every range against the file length).
 */
function layoutCheck(file: string, h: SafetensorsHeader, size: number): string {
  const ranges = [...h.tensors].map(([n, t]) => ({ n, b: t.dataOffsets[0], e: t.dataOffsets[1] })).sort((a, b) => a.b - b.b || a.e - b.e);
  let at = 0;
  for (const r of ranges) {
    if (r.b < at) throw new VerifyError(`${file}: tensor '${r.n}' overlaps the tensor before it (bytes ${r.b}..${r.e} of the data section)`);
    if (r.b > at) throw new VerifyError(`${file}: a hole of ${r.b - at} bytes before tensor '${r.n}' (the safetensors format has none)`);
    at = r.e;
  }
  const data = size - h.dataStart;
  if (at !== data) throw new VerifyError(`${file}: ${data - at} bytes after the last tensor (truncated header or trailing data)`);
  const dtypes = [...new Set([...h.tensors.values()].map((t) => t.dtype))].sort();
  return `${basename(file)}: ${h.tensors.size} tensors (${dtypes.join(", ")}), sizes match dtypes and shapes, no overlaps or holes, ${size} bytes`;
}

function header(file: string): SafetensorsHeader {
  try {
    return readSafetensorsHeader(file);
  } catch (e) {
    throw new VerifyError((e as Error).message);
  }
}

function verifyCheckpoint(dir: string): Report {
  const checks: string[] = [];
  const notes = ["checkpoints carry no checksum: the structure is checked, the weight values cannot be"];
  if (!existsSync(join(dir, "config.json"))) throw new VerifyError(`${dir}: no config.json (not a checkpoint directory)`);
  let files;
  try {
    files = findWeights(dir);
  } catch (e) {
    throw new VerifyError((e as Error).message);
  }
  if (files.index) checks.push(`${basename(files.index.path)}: every weight_map entry names a shard holding that tensor`);
  for (const f of files.files) checks.push(layoutCheck(f, header(f), statSync(f).size));
  let config;
  try {
    config = loadGemma4Config(dir);
  } catch (e) {
    throw new VerifyError(`${dir}: does not load as Gemma 4: ${(e as Error).message}`);
  }
  try {
    // Weights stay lazy: this checks names, shapes and dtypes against the config, not the values.
    using m = loadModel(dir);
    checks.push(
      `loads as Gemma 4 (${config.modelType}, ${config.text.numHiddenLayers} layers, hidden ${config.text.hiddenSize}${config.quantization ? `, ${config.quantization.mode} ${config.quantization.bits}-bit` : ""}): every expected tensor present with its shape; fingerprint ${m.fingerprint}`,
    );
  } catch (e) {
    throw new VerifyError(`${dir}: does not load as Gemma 4: ${(e as Error).message}`);
  }
  for (const w of config.warnings) notes.push(w);
  return { path: dir, kind: "checkpoint", ok: true, checks, notes };
}

function isPromptCache(h: SafetensorsHeader): boolean {
  const md = h.metadata;
  return md["0.mlx_bun_format"] !== undefined || md["mlx_bun.format"] !== undefined || (md["1.0"] !== undefined && md["2.0"] !== undefined);
}

export function verifyPath(path: string): Report {
  if (!existsSync(path)) throw new VerifyError(`${path}: no such file or directory`);
  const st = lstatSync(path).isSymbolicLink() ? statSync(path) : lstatSync(path);
  if (st.isDirectory()) return verifyCheckpoint(path);
  if (!st.isFile()) throw new VerifyError(`${path}: ${st.isFIFO() ? "a FIFO" : st.isSocket() ? "a socket" : "a device"}, not a regular file`);
  const h = header(path);
  if (isPromptCache(h)) {
    let v;
    try {
      v = verifyPromptCache(path);
    } catch (e) {
      throw new VerifyError(e instanceof KvStoreError ? e.message : `${path}: ${(e as Error).message}`);
    }
    const i = v.info;
    const checks = [
      ...v.checks,
      `${i.layers.length} layer caches, ${i.offset} tokens${i.tokenCount !== null ? `, ${i.tokenCount} token ids` : ""}${i.model ? `, made with model ${i.model}` : ""}`,
    ];
    return { path, kind: i.format === "mlx-bun" ? "kv-snapshot" : "mlx-lm-prompt-cache", ok: true, checks, notes: v.notes };
  }
  // A weight file: its structure; and the checkpoint around it when there is one.
  const checks = [layoutCheck(path, h, st.size)];
  const notes = ["safetensors weight files carry no checksum: the structure is checked, the values cannot be"];
  const dir = dirname(path);
  if (existsSync(join(dir, "config.json"))) {
    const r = verifyCheckpoint(dir);
    checks.push(...r.checks.filter((c) => !c.startsWith(`${basename(path)}:`)));
  } else notes.push(`no config.json next to it: not checked as part of a Gemma 4 checkpoint`);
  return { path, kind: "safetensors", ok: true, checks, notes };
}

export async function runVerify(paths: string[], o: VerifyOptions): Promise<number> {
  if (!paths.length) throw new UsageError("verify: give a KV snapshot, a prompt cache or a checkpoint to check");
  let failed = 0;
  for (const p of paths) {
    try {
      const r = verifyPath(p);
      if (o.json) process.stdout.write(`${JSON.stringify(r)}\n`);
      else {
        process.stdout.write(`${p}: OK (${r.kind})\n`);
        for (const c of r.checks) process.stdout.write(`  ok    ${c}\n`);
        for (const n of r.notes) process.stdout.write(`  note  ${n}\n`);
      }
    } catch (e) {
      if (!(e instanceof VerifyError)) throw e;
      failed++;
      if (o.json) process.stdout.write(`${JSON.stringify({ path: p, ok: false, error: e.message })}\n`);
      else process.stderr.write(`mlx-bun verify: FAILED ${e.message}\n`);
    }
  }
  return failed ? 1 : 0;
}
