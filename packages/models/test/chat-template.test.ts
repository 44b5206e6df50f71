import { mkdtempSync, readFileSync, rmSync, writeFileSync, cpSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { Template } from "@huggingface/jinja";
import { ChatTemplate, type ChatMessage, type ChatTemplateOptions, ConfigError, Gemma4Tokenizer } from "../src/index.ts";
import { makeSuite, reference, type TinySuite } from "./helpers.ts";

let suite: TinySuite;
let scratch: string;

const weatherTool = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Weather for a city",
    parameters: { type: "object", properties: { city: { type: "string", description: "City name" }, days: { type: "integer" } }, required: ["city"] },
  },
};

interface Case {
  name: string;
  messages: ChatMessage[];
  /** transformers kwargs; mapped to ChatTemplateOptions below. */
  kwargs: Record<string, unknown>;
}

const CASES: Case[] = [
  { name: "one user turn", messages: [{ role: "user", content: "Hello world!" }], kwargs: { add_generation_prompt: true } },
  {
    name: "system and several turns",
    messages: [
      { role: "system", content: "You are a helpful assistant." },
      { role: "user", content: "What is the capital of France?" },
      { role: "assistant", content: "The capital of France is Paris." },
      { role: "user", content: "  And of Japan?  " },
    ],
    kwargs: { add_generation_prompt: true },
  },
  {
    name: "no generation prompt",
    messages: [
      { role: "user", content: "Hi" },
      { role: "assistant", content: "Hello!" },
    ],
    kwargs: {},
  },
  { name: "thinking on", messages: [{ role: "user", content: "Think: 2+2?" }], kwargs: { add_generation_prompt: true, enable_thinking: true } },
  {
    name: "tools, a tool call and its result",
    messages: [
      { role: "user", content: "Weather in Paris?" },
      { role: "assistant", content: null, tool_calls: [{ type: "function", function: { name: "get_weather", arguments: { city: "Paris", days: 2 } } }] },
      { role: "tool", name: "get_weather", content: "sunny, 21°C" },
    ],
    kwargs: { add_generation_prompt: true, tools: [weatherTool] },
  },
  {
    name: "tool results, then the model's answer in the same turn",
    messages: [
      { role: "system", content: "Use tools." },
      { role: "user", content: "Weather in Paris and Rome?" },
      {
        role: "assistant",
        tool_calls: [
          { type: "function", function: { name: "get_weather", arguments: { city: "Paris" } } },
          { type: "function", function: { name: "get_weather", arguments: { city: "Rome", flags: [true, false, null] } } },
        ],
      },
      { role: "tool", name: "get_weather", content: "sunny" },
      { role: "tool", name: "get_weather", content: { temp: 25, sky: "clear" } },
      { role: "assistant", content: "Sunny in Paris, clear in Rome." },
      { role: "user", content: "Thanks" },
    ],
    kwargs: { add_generation_prompt: true, tools: [weatherTool] },
  },
  {
    name: "content parts, Unicode and emoji",
    messages: [
      {
        role: "user",
        content: [{ type: "image" }, { type: "text", text: "Décris cette image 🖼️, s'il te plaît. 你好" }],
      },
    ],
    kwargs: { add_generation_prompt: true },
  },
  {
    name: "continue the final message",
    messages: [
      { role: "user", content: "Write a poem" },
      { role: "assistant", content: "Roses are red," },
    ],
    kwargs: { continue_final_message: true },
  },
  {
    name: "developer role, reasoning fields",
    messages: [
      { role: "developer", content: "Be terse." },
      { role: "user", content: "Why?" },
      { role: "assistant", content: "Because.", reasoning_content: "short" },
      { role: "user", content: "Ok" },
    ],
    kwargs: { add_generation_prompt: true, enable_thinking: false },
  },
];

function opts(kw: Record<string, unknown>): ChatTemplateOptions {
  const { add_generation_prompt, tools, continue_final_message, ...rest } = kw;
  return {
    addGenerationPrompt: add_generation_prompt as boolean | undefined,
    tools: tools as unknown[] | undefined,
    continueFinalMessage: continue_final_message as boolean | undefined,
    kwargs: rest,
  };
}

let py: { results: { text?: string; ids?: number[]; error?: string }[] };
let pyConfigTemplate: typeof py;

beforeAll(() => {
  suite = makeSuite();
  scratch = mkdtempSync(join(tmpdir(), "mlxb-chat-"));
  const input = CASES.map((c) => ({ messages: c.messages, kwargs: c.kwargs }));
  py = reference("chat", [suite.path("small-bf16")], input);
  pyConfigTemplate = reference("chat", [suite.path("dense-bf16")], input.slice(0, 2));
});
afterAll(() => {
  suite?.cleanup();
  rmSync(scratch, { recursive: true, force: true });
});

describe("chat template output equals transformers' apply_chat_template", () => {
  test.each(CASES.map((c, i) => [c.name, i] as const))("%s", (_name, i) => {
    const dir = suite.path("small-bf16");
    const tok = Gemma4Tokenizer.load(dir);
    const tpl = ChatTemplate.load(dir, tok);
    const p = py.results[i]!;
    expect(p.error).toBeUndefined();
    const o = opts(CASES[i]!.kwargs);
    expect(tpl.render(CASES[i]!.messages, o)).toBe(p.text);
    expect(tpl.apply(tok, CASES[i]!.messages, o)).toEqual(p.ids);
  });

  test("template from tokenizer_config.json (no chat_template.jinja)", () => {
    const dir = suite.path("dense-bf16");
    const tok = Gemma4Tokenizer.load(dir);
    const tpl = ChatTemplate.load(dir, tok);
    expect(tpl.origin).toMatch(/tokenizer_config.json chat_template$/);
    for (let i = 0; i < 2; i++) expect(tpl.render(CASES[i]!.messages, opts(CASES[i]!.kwargs))).toBe(pyConfigTemplate.results[i]!.text);
  });

  test("the rendered prompt starts with one <bos> and tokenizes without a second", () => {
    const dir = suite.path("small-bf16");
    const tok = Gemma4Tokenizer.load(dir);
    const ids = ChatTemplate.load(dir, tok).apply(tok, [{ role: "user", content: "Hi" }], { addGenerationPrompt: true });
    expect(ids[0]).toBe(tok.bosTokenId);
    expect(ids[1]).not.toBe(tok.bosTokenId);
    expect(tok.decode(ids)).toBe("<bos><|turn>user\nHi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>");
  });
});

describe("Python Jinja2 output of scalars", () => {
  test("None and booleans print as Python prints them; the library is restored afterwards", () => {
    const t = new ChatTemplate("{{ none }}|{{ true }}|{{ false }}|{{ x }}|{{ messages[0].n }}|{% macro m() %}M{% endmacro %}{{ m() }}|{{ 1.5 }}");
    expect(t.render([{ role: "user", content: "", n: 3 }], { kwargs: { x: null } })).toBe("None|True|False|None|3|M|1.5");
    expect(new Template("{{ none }}{{ true }}").render({})).toBe("true");
  });
});

describe("loading", () => {
  test("named templates in tokenizer_config.json: tool_use when tools are given", () => {
    const d = join(scratch, "named");
    cpSync(suite.path("dense-bf16"), d, { recursive: true });
    const f = join(d, "tokenizer_config.json");
    const tc = JSON.parse(readFileSync(f, "utf8"));
    tc.chat_template = [
      { name: "default", template: "D{{ messages[0].content }}" },
      { name: "tool_use", template: "T{{ tools | length }}" },
    ];
    writeFileSync(f, JSON.stringify(tc));
    expect(ChatTemplate.load(d).render([{ role: "user", content: "x" }])).toBe("Dx");
    expect(ChatTemplate.load(d, undefined, { withTools: true }).render([{ role: "user", content: "x" }], { tools: [weatherTool] })).toBe("T1");
  });

  test("no template, a broken template, an empty conversation", () => {
    const d = join(scratch, "none");
    cpSync(suite.path("dense-bf16"), d, { recursive: true });
    const f = join(d, "tokenizer_config.json");
    const tc = JSON.parse(readFileSync(f, "utf8"));
    delete tc.chat_template;
    writeFileSync(f, JSON.stringify(tc));
    expect(() => ChatTemplate.load(d)).toThrow(ConfigError);
    expect(() => ChatTemplate.load(d)).toThrow(`${d}: no chat template (chat_template.jinja or tokenizer_config.json's chat_template)`);
    writeFileSync(join(d, "chat_template.jinja"), "{% for %}");
    expect(() => ChatTemplate.load(d)).toThrow(/chat_template.jinja: cannot parse the chat template/);
    const ok = new ChatTemplate("{{ raise_exception('nope') }}");
    expect(() => ok.render([{ role: "user", content: "x" }])).toThrow(/nope/);
    expect(() => ok.render([])).toThrow(/empty conversation/);
  });
});
