// --kv modes: which codec the full- and sliding-attention caches use.
import { affineCodec, type KvCodec, plainCodec, turboQuantCodec } from "@mlx-bun/kv-cache";
import { ConfigError } from "../errors.ts";

/** bf16 (as computed), q8 / q4 (affine, group 64), turbo:<kBits>,<vBits>. */
export type KvMode = { kind: "bf16" } | { kind: "affine"; bits: number; groupSize: number } | { kind: "turbo"; kBits: number; vBits: number };

export function parseKvMode(s: string): KvMode {
  if (s === "bf16" || s === "plain") return { kind: "bf16" };
  if (s === "q8") return { kind: "affine", bits: 8, groupSize: 64 };
  if (s === "q4") return { kind: "affine", bits: 4, groupSize: 64 };
  const m = /^turbo:(\d),(\d)$/.exec(s);
  if (m) return { kind: "turbo", kBits: Number(m[1]), vBits: Number(m[2]) };
  throw new ConfigError(`--kv: unknown KV mode ${JSON.stringify(s)} (bf16 | q8 | q4 | turbo:<kbits>,<vbits>)`);
}

export function kvModeName(m: KvMode): string {
  return m.kind === "bf16" ? "bf16" : m.kind === "affine" ? `q${m.bits}` : `turbo:${m.kBits},${m.vBits}`;
}

// One codec per mode for the process: a TurboQuant codec holds device tables (signs,
// codebooks) that every cache of that mode shares, so they are made once, not per request.
const codecs = new Map<string, KvCodec>();

export function codecFor(m: KvMode): KvCodec {
  if (m.kind === "bf16") return plainCodec;
  const key = kvModeName(m) + (m.kind === "affine" ? `:${m.groupSize}` : "");
  let c = codecs.get(key);
  if (!c) {
    c = m.kind === "affine" ? affineCodec(m.bits, m.groupSize) : turboQuantCodec({ kBits: m.kBits, vBits: m.vBits });
    codecs.set(key, c);
  }
  return c;
}
