// The synthetic prompts of the benches: the same token ids on the mlx-bun side and mlx-lm's
// (compare.ts, kv-prefill.ts, long-context.ts).

/** The first plain-text id: after Gemma's specials and the byte-fallback tokens (make_bench_model.py). */
export const FIRST_TEXT_ID = 280;

/**
 * n token ids: BOS (2), then ids in [FIRST_TEXT_ID, vocab) from a 32-bit LCG seeded by `seed`.
 * The sequence depends only on (n, seed, vocab).
 */
export function syntheticPrompt(n: number, seed: number, vocab = 512): number[] {
  const ids = [2];
  let x = seed * 2654435761 + 12345;
  for (let i = 1; i < n; i++) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0;
    ids.push(FIRST_TEXT_ID + (x % (vocab - FIRST_TEXT_ID)));
  }
  return ids;
}
