// --kv modes: which codec the full- and sliding-attention caches use.
import { affineCodec, type KvCodec, plainCodec, TURBO_K_BITS, TURBO_V_BITS, turboQuantCodec } from "@mlx-bun/kv-cache";
import { MlxArray } from "@mlx-bun/mlx-ffi";
import { type Gemma4Config, type LayerType, layerSpecs } from "../config.ts";
import { ConfigError } from "../errors.ts";

/** bf16 (as computed), q8 / q4 (affine, group 64), turbo:<kBits>,<vBits>. */
export type KvMode = { kind: "bf16" } | { kind: "affine"; bits: number; groupSize: number } | { kind: "turbo"; kBits: number; vBits: number };

export function parseKvMode(s: string): KvMode {
  if (s === "bf16" || s === "plain") return { kind: "bf16" };
  if (s === "q8") return { kind: "affine", bits: 8, groupSize: 64 };
  if (s === "q4") return { kind: "affine", bits: 4, groupSize: 64 };
  const m = /^turbo:(\d),(\d)$/.exec(s);
  if (m) {
    const kBits = Number(m[1]);
    const vBits = Number(m[2]);
    if (!TURBO_K_BITS.includes(kBits) || !TURBO_V_BITS.includes(vBits)) {
      throw new ConfigError(`--kv ${s}: TurboQuant takes key bits ${TURBO_K_BITS.join(", ")} and value bits ${TURBO_V_BITS.join(", ")}, got ${kBits},${vBits}`);
    }
    return { kind: "turbo", kBits, vBits };
  }
  throw new ConfigError(`--kv: unknown KV mode ${JSON.stringify(s)} (bf16 | q8 | q4 | turbo:<kbits>,<vbits>)`);
}

export function kvModeName(m: KvMode): string {
  return m.kind === "bf16" ? "bf16" : m.kind === "affine" ? `q${m.bits}` : `turbo:${m.kBits},${m.vBits}`;
}

/** A key equal for equal modes and different otherwise (kvModeName plus the affine group size). */
export function kvModeKey(m: KvMode): string {
  return kvModeName(m) + (m.kind === "affine" ? `:${m.groupSize}` : "");
}

// One codec per mode for the process: a TurboQuant codec holds device tables (signs,
// codebooks) that every cache of that mode shares, so they are made once, not per request.
const codecs = new Map<string, KvCodec>();

export function codecFor(m: KvMode): KvCodec {
  if (m.kind === "bf16") return plainCodec;
  const key = kvModeKey(m);
  let c = codecs.get(key);
  if (!c) {
    c = m.kind === "affine" ? affineCodec(m.bits, m.groupSize) : turboQuantCodec({ kBits: m.kBits, vBits: m.vBits });
    codecs.set(key, c);
  }
  return c;
}

/**
 * Check at start-up that KV mode `m` can hold every cache of the model described by `config`:
 * its bits are valid and each K/V-owning layer's head dim suits the codec (affine: a multiple of
 * the group size; TurboQuant: a Walsh-Hadamard size). `layers` limits the check to one layer type
 * (e.g. mlx-lm's kv_bits quantizes only the full-attention caches). Throws a ConfigError naming
 * the mode, the layer type and the head dim, instead of a failure on the first request.
 */
export function checkKvMode(m: KvMode, config: Gemma4Config, opts: { layers?: LayerType; what?: string } = {}): void {
  const what = opts.what ?? `--kv ${kvModeName(m)}${m.kind === "affine" && m.groupSize !== 64 ? ` (group size ${m.groupSize})` : ""}`;
  if (m.kind === "bf16") return;
  let codec: KvCodec;
  try {
    codec = codecFor(m);
  } catch (e) {
    throw new ConfigError(`${what}: ${(e as Error).message}`);
  }
  const seen = new Set<string>();
  for (const s of layerSpecs(config.text)) {
    if (!s.hasKv || (opts.layers && s.type !== opts.layers) || seen.has(`${s.type}:${s.headDim}`)) continue;
    seen.add(`${s.type}:${s.headDim}`);
    using k = MlxArray.fromNumbers(new Float32Array(s.headDim), [1, 1, 1, s.headDim]);
    try {
      codec.check(k, k);
    } catch (e) {
      const why = (e as Error).message.replace(/\s*\(array\(shape=.*\)\)$/, "");
      throw new ConfigError(`${what} cannot hold this model's ${s.type.replace("_", "-")} layers (head dim ${s.headDim}): ${why}`);
    }
  }
}
