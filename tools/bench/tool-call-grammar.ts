// Forced tool calls (tool_choice "required"): the build time of a tool-call grammar processor on a
// synthetic 262,144-token byte-fallback vocabulary (Gemma 4's size; the bench models have the
// 512-token tiny tokenizer) with Gemma 4's delimiter tokens — cold (tokenizer info + compile), a
// new tool list on the warm compiler, a cached one — and the longest event-loop stall while the
// new list compiles (a 1 ms interval probe; the compile runs in the grammar worker).
//
//   .native/bin/bun tools/bench/tool-call-grammar.ts [--tools 4]
import type { Gemma4Tokenizer } from "@mlx-bun/models";
import { StructuredOutputCompiler, type ToolSpec, toolCallProcessor } from "@mlx-bun/runtime";

const argv = process.argv.slice(2);
const nTools = Number(argv[argv.indexOf("--tools") + 1] ?? 4) || 4;

function syntheticTokenizer(): Gemma4Tokenizer {
  const V = 262144;
  let seed = 12345;
  const rnd = () => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32;
  const chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789{}[]:,\"'.-_!?()<>|\u2581\u2581\u2581\u2581éüñ中文の";
  const specials = ["<pad>", "<eos>", "<bos>", "<|tool_call>", "<tool_call|>", '<|"|>', "<|channel>", "<channel|>", "<|tool_response>"];
  const added = specials.map((content, id) => ({ id, content, special: true }));
  const vocab: Record<string, number> = {};
  let id = specials.length;
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
  const ids = new Map(specials.map((s, i) => [s, i]));
  return { tokenizerJson, eosTokenIds: new Set([1, 8]), tokenToId: (t: string) => ids.get(t) } as unknown as Gemma4Tokenizer;
}

const tools = (tag: string): ToolSpec[] =>
  Array.from({ length: nTools }, (_, i) => ({
    name: `tool_${tag}_${i}`,
    parameters: {
      type: "object",
      properties: {
        city: { type: "string", maxLength: 32 },
        unit: { enum: ["celsius", "fahrenheit"] },
        days: { type: "integer" },
        hours: { type: "array", items: { type: "number" }, maxItems: 8 },
        filter: { type: "object", properties: { q: { type: "string" }, limit: { type: "integer" } }, required: ["q"] },
      },
      required: ["city", "unit"],
    },
  }));

const tok = syntheticTokenizer();
const build = async (t: ToolSpec[]) => {
  const t0 = performance.now();
  (await toolCallProcessor(tok, { tools: t, thinking: true }, { promptTokens: 1 })).dispose();
  return performance.now() - t0;
};
const coldMs = await build(tools("a"));
// The longest gap between 1 ms ticks while a new tool list compiles.
let last = performance.now();
let stall = 0;
const probe = setInterval(() => {
  const now = performance.now();
  stall = Math.max(stall, now - last);
  last = now;
}, 1);
last = performance.now();
const newListMs = await build(tools("b"));
// Let the probe run once more: a stall shows only when the timer fires after it.
await new Promise((r) => setTimeout(r, 10));
clearInterval(probe);
const cachedMs = await build(tools("b"));
StructuredOutputCompiler.forToolCalls(tok).close();
console.log(
  JSON.stringify(
    {
      vocab: 262144,
      tools: nTools,
      coldMs: +coldMs.toFixed(1),
      newToolListMs: +newListMs.toFixed(1),
      maxEventLoopStallMs: +stall.toFixed(1),
      cachedMs: +cachedMs.toFixed(2),
    },
    null,
    2,
  ),
);
process.exit(0);
