// kv-store / prompt-cache tests: tiny checkpoints and a greedy loop straight over model.forward.
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import type { Cache } from "@mlx-bun/kv-cache";
import { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import type { Gemma4Model } from "@mlx-bun/models";
import { runPython } from "../../../tools/oracle/oracle.ts";

export const ROOT = fileURLToPath(new URL("../../..", import.meta.url));
export const MAKER = join(ROOT, "tools", "make-tiny-model", "make_tiny_model.py");

export function tempDir(prefix: string): { dir: string; cleanup(): void } {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  return { dir, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

/** make_tiny_model.py --out `out` `args`. */
export function makeTiny(out: string, args: string[]): string {
  runPython([MAKER, "--out", out, ...args]);
  return out;
}

/** A copy of checkpoint `src` at `out` with text_config fields replaced (weights unchanged). */
export function withConfig(src: string, out: string, patch: Record<string, unknown>): string {
  cpSync(src, out, { recursive: true });
  const f = join(out, "config.json");
  const cfg = JSON.parse(readFileSync(f, "utf8"));
  Object.assign(cfg.text_config ?? cfg, patch);
  writeFileSync(f, JSON.stringify(cfg, null, 2));
  return out;
}

/** Deterministic prompt ids in the tiny vocab's ordinary range. */
export function promptIds(n: number, salt = 0): number[] {
  return Array.from({ length: n }, (_, i) => 5 + ((i * 37 + salt * 11) % 200));
}

export interface GreedyRun extends Disposable {
  /** The tokens picked, one per step. */
  tokens: number[];
  /** The logits row [vocab] each token was picked from (owned: dispose them). */
  rows: MlxArray[];
  dispose(): void;
}

/**
 * Feed `feed` (in chunks of `chunk`, default all at once), then pick `steps` tokens greedily,
 * feeding each one back except the last (as a generator would: the last token is not fed).
 */
export function greedy(model: Gemma4Model, caches: Cache[], feed: readonly number[], steps: number, chunk = 0): GreedyRun {
  const rows: MlxArray[] = [];
  const tokens: number[] = [];
  const size = chunk || feed.length;
  let logits: MlxArray | undefined;
  try {
    for (let s = 0; s < feed.length; s += size) {
      logits?.dispose();
      const part = feed.slice(s, s + size);
      using ids = MlxArray.fromNumbers(part, [1, part.length], "int32");
      logits = model.forward(ids, caches).eval();
    }
    for (let i = 0; i < steps; i++) {
      const last = mx.index(logits!, 0, -1).eval();
      rows.push(last);
      logits!.dispose();
      logits = undefined;
      using am = mx.argmax(last, -1);
      const tok = am.item();
      tokens.push(tok);
      if (i === steps - 1) break;
      using ids = MlxArray.fromNumbers([tok], [1, 1], "int32");
      logits = model.forward(ids, caches).eval();
    }
  } catch (e) {
    for (const r of rows) r.dispose();
    throw e;
  } finally {
    logits?.dispose();
  }
  const dispose = (): void => rows.forEach((r) => r.dispose());
  return { tokens, rows, dispose, [Symbol.dispose]: dispose };
}

/** A digest of every cache's state (signature, meta, tensor bytes), to check caches are unchanged. */
export function cacheDigest(caches: readonly Cache[]): string {
  const parts: string[] = [];
  for (const c of caches) {
    using s = c.state();
    parts.push(`${s.signature}|${JSON.stringify(s.meta)}|${c.minimumReusableOffset}`);
    for (const t of s.tensors) parts.push(`${t.dtype}[${t.shape}]:${Bun.hash.xxHash3(new Uint8Array(t.toTypedArray().buffer)).toString(16)}`);
  }
  return parts.join(";");
}

/**
 * Dispose caches, and with `codecs` their codecs' tables too (makeCaches builds a new TurboQuant
 * codec per call whose sign/codebook arrays outlive the caches).
 */
export function disposeCaches(caches: readonly Cache[], codecs = false): void {
  for (const c of caches) c.dispose();
  if (!codecs) return;
  const seen = new Set<unknown>();
  for (const c of caches) {
    const codec = (c as { codec?: { dispose?: () => void } }).codec;
    if (codec && !seen.has(codec)) {
      seen.add(codec);
      codec.dispose?.();
    }
  }
}
