// A random byte-fallback BPE tokenizer of 262,144 tokens (Gemma 4's vocabulary size), for grammar
// benchmarks that need a real-sized vocabulary without a checkpoint: `specials` take ids 0.., then
// the 256 byte tokens, then random strings of `chars` (fixed seed, so every run sees the same one).
import type { Gemma4Tokenizer } from "@mlx-bun/models";

const BASE_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789{}[]:,\"'.-_!?()\u2581\u2581\u2581\u2581éüñ中文の";

export function syntheticTokenizer(o: { specials: string[]; eos: number[]; extraChars?: string }): Gemma4Tokenizer {
  const V = 262144;
  let seed = 12345;
  const rnd = () => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32;
  const chars = BASE_CHARS + (o.extraChars ?? "");
  const added = o.specials.map((content, id) => ({ id, content, special: true }));
  const vocab: Record<string, number> = {};
  let id = o.specials.length;
  for (let b = 0; b < 256; b++) vocab[`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`] = id++;
  while (id < V) {
    const n = 1 + Math.floor(rnd() * rnd() * 10);
    let t = "";
    for (let k = 0; k < n; k++) t += chars[Math.floor(rnd() * chars.length)];
    if (vocab[t] === undefined) vocab[t] = id++;
  }
  const tokenizerJson = {
    model: { type: "BPE", vocab, byte_fallback: true },
    added_tokens: added,
    decoder: { type: "Sequence", decoders: [{ type: "Replace" }, { type: "ByteFallback" }, { type: "Fuse" }] },
  };
  const ids = new Map(o.specials.map((s, i) => [s, i]));
  // Only what the grammar code reads of a tokenizer.
  return { tokenizerJson, eosTokenIds: new Set(o.eos), tokenToId: (t: string) => ids.get(t) } as unknown as Gemma4Tokenizer;
}
