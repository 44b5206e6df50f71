// Tool-call grammars (src/tool-call-grammar.ts, toolCallProcessor): a Gemma 4 turn forced to be
// calls of allowed functions. On a tiny random-weight model, every sampled output (several seeds,
// solo and batched) is parsed by the Gemma 4 parser (= mlx-lm's) and its arguments validated by
// ajv against the tool's schema; the delimiters are only ever their special tokens; the text the
// chat template writes for a call is accepted; names the parser cannot read are refused.
import Ajv2020 from "ajv/dist/2020.js";
import { memory } from "@mlx-bun/mlx-ffi";
import { parseToolCalls } from "@mlx-bun/models";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { Engine, type GenerateRequest, Scheduler, type ToolSpec, toolCallProcessor, ToolGrammarError } from "../src/index.ts";
import { tinyModels } from "./helpers.ts";

let models: ReturnType<typeof tinyModels>;
let engine: Engine;
beforeAll(() => {
  models = tinyModels({ small: ["--variant", "small"] });
  engine = Engine.load(models.path("small"));
});
afterAll(() => {
  engine?.dispose();
  models?.cleanup();
});

const ajv = new Ajv2020({ strict: false, allErrors: true });

// Strings as enums and bounded arrays: a random-weight model (512-token vocabulary) ends every
// value soon (a free string ends only when it samples <|"|>, one of ~480 allowed tokens).
const TOOLS: ToolSpec[] = [
  {
    name: "get_weather",
    parameters: {
      type: "object",
      properties: {
        city: { enum: ["Paris", "Oslo", "São Paulo"] },
        unit: { enum: ["celsius", "fahrenheit"] },
        days: { type: "integer" },
        hours: { type: "array", items: { type: "number" }, maxItems: 3 },
        metric: { type: "boolean" },
      },
      required: ["city", "unit"],
    },
  },
  {
    name: "set-alarm",
    parameters: {
      type: "object",
      properties: {
        at: { $ref: "#/$defs/time" },
        label: { anyOf: [{ const: "wake" }, { type: "null" }] },
        "first name": { const: "Ann" },
      },
      required: ["at", "first name"],
      $defs: { time: { type: "object", properties: { h: { type: "integer" }, m: { type: "integer" } }, required: ["h", "m"] } },
    },
  },
  { name: "ping", parameters: { type: "object", properties: {}, additionalProperties: false } },
];

/** A free string (only in the token-by-token checks: a random model would write it forever). */
const NOTE: ToolSpec = { name: "note", parameters: { type: "object", properties: { text: { type: "string" } }, required: ["text"] } };

const validators = new Map(TOOLS.map((t) => [t.name, ajv.compile(t.parameters as object)]));
const solo = { submit: (r: GenerateRequest) => engine.generate(r) };
const prompt = (i: number) => Array.from({ length: 5 + (i % 4) }, (_, j) => 30 + ((i * 41 + j * 13) % 400));

async function run(sched: { submit(r: GenerateRequest): ReturnType<Scheduler["submit"]> }, tools: ToolSpec[], req: Omit<GenerateRequest, "logitsProcessors">) {
  const p = await toolCallProcessor(engine.loaded.tokenizer, { tools, thinking: false }, { promptTokens: req.promptIds.length });
  try {
    const s = sched.submit({ ...req, keepSpecialTokens: true, logitsProcessors: [p] });
    for await (const _ of s) {
    }
    return await s.result;
  } finally {
    p.dispose();
  }
}

function checkCalls(text: string, allowed: readonly string[]) {
  const calls = parseToolCalls(text);
  for (const c of calls) {
    expect(allowed).toContain(c.name);
    const v = validators.get(c.name)!;
    if (!v(c.arguments)) throw new Error(`${c.name} ${JSON.stringify(c.arguments)} does not validate: ${ajv.errorsText(v.errors)}`);
  }
  return calls;
}

describe("tool-call grammar on a tiny model", () => {
  test("required (all tools) and one named tool, 8 seeds each, batched: every output is calls of allowed tools with valid arguments", async () => {
    const tok = engine.loaded.tokenizer;
    await run(solo, TOOLS, { promptIds: prompt(99), maxTokens: 100, sampling: { temperature: 0 } }); // warm-up: caches made once
    const base = memory.active();
    const specials = ["<|tool_call>", "<tool_call|>", '<|"|>'].map((t) => tok.tokenToId(t)!);
    const sched = new Scheduler(engine, { maxBatch: 16 });
    try {
      const jobs: Promise<void>[] = [];
      let k = 0;
      for (const tools of [TOOLS, [TOOLS[0]!], [TOOLS[1]!]]) {
        for (let seed = 0; seed < 8; seed++) {
          const i = k++;
          jobs.push(
            run(sched, tools, { promptIds: prompt(i), maxTokens: 400, sampling: { temperature: 1, seed } }).then((r) => {
              if (r.finishReason !== "stop") throw new Error(`seed ${seed}: finished by ${r.finishReason} after ${r.tokens.length} tokens: ${r.text}`);
              expect(r.tokens[0]).toBe(specials[0]);
              expect(tok.eosTokenIds.has(r.tokens.at(-1)!)).toBe(true);
              // The delimiters' text appears exactly as often as their tokens: never spelled out.
              const text = tok.decode(r.tokens.slice(0, -1), { skipSpecialTokens: false });
              for (const [j, t] of ["<|tool_call>", "<tool_call|>", '<|"|>'].entries()) {
                expect(text.split(t).length - 1).toBe(r.tokens.filter((x) => x === specials[j]).length);
              }
              checkCalls(
                text,
                tools.map((t) => t.name),
              );
            }),
          );
        }
      }
      await Promise.all(jobs);
    } finally {
      await sched.close();
    }
    expect(memory.active()).toBeLessThanOrEqual(base + 1024);
  }, 300_000);

  test("the chat template's rendering of calls is accepted token by token; thinking first is allowed only when on", async () => {
    const tok = engine.loaded.tokenizer;
    const Q = '<|"|>';
    const text = `<|tool_call>call:get_weather{city:${Q}Paris${Q},days:3,hours:[6,12.5],metric:true,unit:${Q}celsius${Q}}<tool_call|><|tool_call>call:set-alarm{at:{h:7,m:0},"first name":${Q}Ann${Q},label:${Q}wake${Q}}<tool_call|>`;
    const ids = tok.encode(text, { addSpecialTokens: false });
    const accepts = async (thinking: boolean, ids: number[]) => {
      using p = await toolCallProcessor(tok, { tools: [...TOOLS, NOTE], thinking }, { promptTokens: 0 });
      try {
        await p.advance(ids);
        return true;
      } catch {
        return false;
      }
    };
    expect(await accepts(false, ids)).toBe(true);
    const thought = tok.encode("<|channel>thought\nCall it.<channel|>", { addSpecialTokens: false });
    expect(await accepts(true, [...thought, ...ids])).toBe(true);
    expect(await accepts(false, [...thought, ...ids])).toBe(false);
    // A call the grammar must refuse: a required key missing; an undeclared tool.
    expect(await accepts(false, tok.encode(`<|tool_call>call:get_weather{city:${Q}Paris${Q}}<tool_call|>`, { addSpecialTokens: false }))).toBe(false);
    expect(await accepts(false, tok.encode("<|tool_call>call:other{}<tool_call|>", { addSpecialTokens: false }))).toBe(false);
    // Strings never hold "<|" or "|>" (a spelled-out delimiter would end them early for the text parser).
    for (const bad of ["a<|b", "a|>b"]) {
      const t = `<|tool_call>call:note{text:${Q}${bad}${Q}}<tool_call|>`;
      expect(await accepts(false, tok.encode(t, { addSpecialTokens: false }))).toBe(false);
    }
    expect(await accepts(false, tok.encode(`<|tool_call>call:note{text:${Q}Hi, a<b|c> 中文${Q}}<tool_call|>`, { addSpecialTokens: false }))).toBe(true);
  });

  test("a function name or enum the parser cannot read back is a ToolGrammarError", async () => {
    const tok = engine.loaded.tokenizer;
    await expect(toolCallProcessor(tok, { tools: [{ name: "a.b" }], thinking: false })).rejects.toThrow(ToolGrammarError);
    await expect(toolCallProcessor(tok, { tools: [], thinking: false })).rejects.toThrow(ToolGrammarError);
    await expect(
      toolCallProcessor(tok, { tools: [{ name: "f", parameters: { type: "object", properties: { x: { enum: ['<|"|>'] } } } }], thinking: false }),
    ).rejects.toThrow(/enum/);
  });
});
