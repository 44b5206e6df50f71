// Forced tool calls (tool_choice "required"): the build time of a tool-call grammar processor on a
// synthetic 262,144-token byte-fallback vocabulary (Gemma 4's size; the bench models have the
// 512-token tiny tokenizer) with Gemma 4's delimiter tokens — cold (tokenizer info + compile), a
// new tool list on the warm compiler, a cached one — and the longest event-loop stall while the
// new list compiles (a 1 ms interval probe; the compile runs in the grammar worker).
//
//   .native/bin/bun tools/bench/tool-call-grammar.ts [--tools 4]
import { StructuredOutputCompiler, type ToolSpec, toolCallProcessor } from "@mlx-bun/runtime";
import { syntheticTokenizer } from "./synthetic-tokenizer.ts";
import { stallProbe } from "./stall-probe.ts";

const argv = process.argv.slice(2);
const nTools = Number(argv[argv.indexOf("--tools") + 1] ?? 4) || 4;

const SPECIALS = ["<pad>", "<eos>", "<bos>", "<|tool_call>", "<tool_call|>", '<|"|>', "<|channel>", "<channel|>", "<|tool_response>"];

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

const tok = syntheticTokenizer({ specials: SPECIALS, eos: [1, 8], extraChars: "<>|" });
const build = async (t: ToolSpec[]) => {
  const t0 = performance.now();
  (await toolCallProcessor(tok, { tools: t, thinking: true }, { promptTokens: 1 })).dispose();
  return performance.now() - t0;
};
const coldMs = await build(tools("a"));
// The longest gap between 1 ms ticks while a new tool list compiles.
const probe = stallProbe();
const newListMs = await build(tools("b"));
// Let the probe run once more: a stall shows only when the timer fires after it.
await new Promise((r) => setTimeout(r, 10));
probe.stop();
const stall = probe.max;
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
