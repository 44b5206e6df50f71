// Irreversible conversions of a bf16 (plain) cache to a quantized codec, keeping the offset.
import { affineCodec } from "./affine.ts";
import { plainCodec } from "./codec.ts";
import { KVCache, makeState } from "./growable.ts";
import { turboQuantCodec, type TurboQuantOptions } from "./turboquant.ts";
import { disposeAll } from "./planes.ts";
import { fail } from "./types.ts";
import type { KvCodec } from "./codec.ts";

/** Convert a plain KVCache to `codec` (consumes the source); `what` names the caller in errors. */
export function convert(source: KVCache, codec: KvCodec, what: string): KVCache {
  if (source.codec !== plainCodec) fail(`${what}: the source must be a plain (bf16/fp16/fp32) KVCache, got ${source.signature()}`);
  const out = new KVCache(codec);
  const planes = source.planes;
  if (planes && source.offset > 0) {
    using state = source.state();
    const [k, v] = state.tensors as [NonNullable<(typeof state.tensors)[0]>, NonNullable<(typeof state.tensors)[1]>];
    codec.check(k, v);
    const enc = codec.encode(k, v);
    try {
      out.restoreState(makeState(codec.name, enc, { offset: source.offset }));
    } catch (e) {
      disposeAll(enc);
      throw e;
    }
  }
  // Older prefixes were never seen in the new precision: reusing one would differ from a fresh run.
  out.minimumReusableOffset = Math.max(source.minimumReusableOffset, source.offset);
  source.dispose();
  return out;
}

/** bf16 → affine (mlx-lm's KVCache.to_quantized); consumes the source. */
export function toAffine(source: KVCache, bits = 8, groupSize = 64): KVCache {
  return convert(source, affineCodec(bits, groupSize), "toAffine");
}

/** bf16 → TurboQuant; consumes the source. */
export function toTurboQuant(source: KVCache, opts: TurboQuantOptions): KVCache {
  return convert(source, turboQuantCodec(opts), "toTurboQuant");
}
