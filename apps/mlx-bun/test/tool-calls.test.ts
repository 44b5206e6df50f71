// Gemma 4 tool calls and thinking through the server, with the official npm and Python `openai`
// clients. The tiny random model is made to write a fixed output (a logits processor that allows
// one token per step, injected where requests enter the scheduler), so the server's parsing,
// streaming deltas, finish_reason and the tool-result round trip are what is tested.
import Anthropic from "@anthropic-ai/sdk";
import { memory } from "@mlx-bun/mlx-ffi";
import type { Engine, GenerateRequest, Scheduler } from "@mlx-bun/runtime";
import Ajv2020 from "ajv/dist/2020.js";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { runPython, runPythonAsync } from "../../../tools/oracle/oracle.ts";
import { chatPromptIds } from "../src/prompt.ts";
import type { RunningServer } from "../src/server/http.ts";
import { type ScriptedServer, startScriptedServer } from "./scripted.ts";

let fx: ScriptedServer;
let dir: string;
let engine: Engine;
let scheduler: Scheduler;
let srv: RunningServer;
let client: OpenAI;
let anthropic: Anthropic;
/** What the next requests are made to write (FIFO), and every request submitted. */
let scripts: string[];
let seen: GenerateRequest[];
const MODEL = "tiny";

beforeAll(() => {
  fx = startScriptedServer("mlxb-tools-", MODEL);
  ({ dir, engine, scheduler, srv } = fx);
  ({ scripts, seen } = fx.sink);
  client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: "not-needed", maxRetries: 0 });
  anthropic = new Anthropic({ baseURL: srv.url, apiKey: "not-needed", maxRetries: 0 });
});

afterAll(() => fx?.stop());

const Q = '<|"|>';
const CALL = `<|tool_call>call:get_weather{city:${Q}Paris, "the" {capital}${Q},days:3,metric:true,hours:[6,12.5]}<tool_call|>`;
const TOOLS: OpenAI.ChatCompletionTool[] = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Weather for a city",
      parameters: {
        type: "object",
        properties: { city: { type: "string" }, days: { type: "integer" }, metric: { type: "boolean" }, hours: { type: "array", items: { type: "number" } } },
        required: ["city"],
      },
    },
  },
];
const ARGS = { city: 'Paris, "the" {capital}', days: 3, metric: true, hours: [6, 12.5] };

describe("tool calls and thinking (Gemma 4 markup) through the server", () => {
  test("npm openai client: a tool call, streamed and not; the tool result goes back through the template", async () => {
    const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: "user", content: "Weather in Paris?" }];
    scripts.push(CALL);
    const r = await client.chat.completions.create({ model: MODEL, messages, tools: TOOLS, max_tokens: 200, temperature: 0 });
    const c = r.choices[0]!;
    expect(c.finish_reason).toBe("tool_calls");
    expect(c.message.content).toBeNull();
    expect(c.message.tool_calls).toHaveLength(1);
    const call = c.message.tool_calls![0]! as OpenAI.ChatCompletionMessageFunctionToolCall;
    expect(call.type).toBe("function");
    expect(call.id).toMatch(/^call_[0-9a-f]{32}$/);
    expect(call.function.name).toBe("get_weather");
    expect(JSON.parse(call.function.arguments)).toEqual(ARGS);

    // Streamed: the same call arrives as one tool_calls delta with its index.
    scripts.push(`Let me check.${CALL}`);
    const stream = await client.chat.completions.create({ model: MODEL, messages, tools: TOOLS, max_tokens: 200, temperature: 0, stream: true });
    let content = "";
    const calls: { index: number; name?: string; args: string }[] = [];
    let finish: string | null = null;
    for await (const chunk of stream) {
      const d = chunk.choices[0]?.delta;
      if (d?.content) content += d.content;
      for (const tc of d?.tool_calls ?? []) {
        calls[tc.index] ??= { index: tc.index, args: "" };
        if (tc.function?.name) calls[tc.index]!.name = tc.function.name;
        calls[tc.index]!.args += tc.function?.arguments ?? "";
      }
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    expect(content).toBe("Let me check.");
    expect(calls.map((x) => [x.name, JSON.parse(x.args)])).toEqual([["get_weather", ARGS]]);
    expect(finish).toBe("tool_calls");

    // The round trip: the call and its result in the history, rendered by the model's template as mlx-lm renders them.
    scripts.push("It is sunny.");
    const history: OpenAI.ChatCompletionMessageParam[] = [
      ...messages,
      { role: "assistant", content: null, tool_calls: [call] },
      { role: "tool", tool_call_id: call.id, content: JSON.stringify({ temperature: 21, sky: "clear" }) },
    ];
    const r2 = await client.chat.completions.create({ model: MODEL, messages: history, tools: TOOLS, max_tokens: 50, temperature: 0 });
    expect(r2.choices[0]!.message.content).toBe("It is sunny.");
    expect(r2.choices[0]!.finish_reason).toBe("stop");
    const pyIds = JSON.parse(
      runPython([
        "-c",
        "import json,sys; from mlx_lm.utils import load_tokenizer; from pathlib import Path; t=load_tokenizer(Path(sys.argv[1])); m=json.loads(sys.argv[2]); [x['function'].__setitem__('arguments', json.loads(x['function']['arguments'])) for mm in m for x in (mm.get('tool_calls') or [])]; print(json.dumps(t.apply_chat_template(m, tools=json.loads(sys.argv[3]), add_generation_prompt=True)))",
        dir,
        JSON.stringify(history),
        JSON.stringify(TOOLS),
      ]),
    ) as number[];
    expect(seen.at(-1)!.promptIds).toEqual(pyIds);
  });

  test("thinking: reasoning_content (and mlx_lm.server's reasoning) apart from the content, streamed and not", async () => {
    const out = "<|channel>thought\nThe user greets me.<channel|>Hello!";
    scripts.push(out);
    const r = await client.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "Hi" }], max_tokens: 100, temperature: 0 });
    const m = r.choices[0]!.message as OpenAI.ChatCompletionMessage & { reasoning_content?: string; reasoning?: string };
    expect(m.content).toBe("Hello!");
    expect(m.reasoning_content).toBe("\nThe user greets me.");
    expect(m.reasoning).toBe(m.reasoning_content);
    expect(r.choices[0]!.finish_reason).toBe("stop");
    scripts.push(out);
    const stream = await client.chat.completions.create({
      model: MODEL,
      messages: [{ role: "user", content: "Hi" }],
      max_tokens: 100,
      temperature: 0,
      stream: true,
    });
    let content = "";
    let reasoning = "";
    for await (const chunk of stream) {
      const d = chunk.choices[0]?.delta as { content?: string; reasoning_content?: string } | undefined;
      content += d?.content ?? "";
      reasoning += d?.reasoning_content ?? "";
      expect(d?.content ?? "").not.toContain("<|channel>");
    }
    expect([reasoning, content]).toEqual(["\nThe user greets me.", "Hello!"]);
  });

  test("tool_choice none bans the tool-call opening; reasoning_effort none turns thinking off; bad tool_choice is a 400", async () => {
    const tok = engine.loaded.tokenizer;
    const open = tok.tokenToId("<|tool_call>")!;
    // A strong bias would make the model open a tool call at once; tool_choice none forbids it.
    const biased = {
      model: MODEL,
      messages: [{ role: "user" as const, content: "Hi" }],
      tools: TOOLS,
      max_tokens: 4,
      temperature: 0,
      logit_bias: { [open]: 100 },
      logprobs: true,
    };
    const auto = await client.chat.completions.create(biased);
    expect(auto.choices[0]!.logprobs!.content![0]!.token).toBe("<|tool_call>");
    const none = await client.chat.completions.create({ ...biased, tool_choice: "none" });
    expect(none.choices[0]!.logprobs!.content!.map((e) => e.token)).not.toContain("<|tool_call>");
    // reasoning_effort "none" renders the prompt as enable_thinking false.
    await client.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "Hi" }], max_tokens: 1, reasoning_effort: "none" } as never);
    const off = chatPromptIds(engine.loaded, [{ role: "user", content: "Hi" }], { kwargs: { enable_thinking: false } });
    expect(seen.at(-1)!.promptIds).toEqual(off);
    const bad = await fetch(`${srv.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ messages: [{ role: "user", content: "Hi" }], tools: TOOLS, tool_choice: { type: "function", function: { name: "nope" } } }),
    });
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as { error: { param: string } }).error.param).toBe("tool_choice");
  });

  test("the official Python openai client reads the same tool call and reasoning", async () => {
    scripts.push(`<|channel>thought\nNeed the weather.<channel|>${CALL}`);
    const script = [
      "import json, sys",
      "from openai import OpenAI",
      "c = OpenAI(base_url=sys.argv[1], api_key='x', max_retries=0)",
      "r = c.chat.completions.create(model='tiny', messages=[{'role': 'user', 'content': 'Weather?'}], tools=json.loads(sys.argv[2]), max_tokens=200, temperature=0)",
      "m = r.choices[0].message",
      "print(json.dumps({'finish': r.choices[0].finish_reason, 'content': m.content, 'reasoning': getattr(m, 'reasoning_content', None), 'calls': [[t.function.name, json.loads(t.function.arguments)] for t in m.tool_calls]}))",
    ].join("\n");
    const out = JSON.parse(await runPythonAsync(["-c", script, `${srv.url}/v1`, JSON.stringify(TOOLS)])) as Record<string, unknown>;
    expect(out).toEqual({ finish: "tool_calls", content: null, reasoning: "\nNeed the weather.", calls: [["get_weather", ARGS]] });
  });
});

// tool_choice "required" / a named function, enforced by a grammar (runtime toolCallProcessor): the
// random-weight model is not scripted here, so every call below is what the grammar let it write.
// Strings as enums and bounded arrays: a random model ends each value soon.
const FORCED_TOOLS: OpenAI.ChatCompletionFunctionTool[] = [
  {
    type: "function",
    function: {
      name: "get_weather",
      parameters: {
        type: "object",
        properties: {
          city: { enum: ["Paris", "Oslo"] },
          unit: { enum: ["celsius", "fahrenheit"] },
          days: { type: "integer" },
          hours: { type: "array", items: { type: "number" }, maxItems: 2 },
        },
        required: ["city", "unit"],
      },
    },
  },
  {
    type: "function",
    function: { name: "ping", parameters: { type: "object", properties: { loud: { type: "boolean" } }, required: ["loud"] } },
  },
];
const ajv = new Ajv2020({ strict: false });
const forcedValidators = new Map(FORCED_TOOLS.map((t) => [t.function.name, ajv.compile(t.function.parameters!)]));

function checkForced(calls: { name: string; args: unknown }[], allowed: readonly string[], what: string): void {
  expect(calls.length, what).toBeGreaterThan(0);
  for (const c of calls) {
    expect(allowed, what).toContain(c.name);
    const v = forcedValidators.get(c.name)!;
    if (!v(c.args)) throw new Error(`${what}: ${c.name} ${JSON.stringify(c.args)} does not validate: ${ajv.errorsText(v.errors)}`);
  }
}

describe("tool_choice required and named functions are enforced (grammar)", () => {
  const choices: { choice: OpenAI.ChatCompletionToolChoiceOption; allowed: string[] }[] = [
    { choice: "required", allowed: ["get_weather", "ping"] },
    { choice: { type: "function", function: { name: "ping" } }, allowed: ["ping"] },
    { choice: { type: "function", function: { name: "get_weather" } }, allowed: ["get_weather"] },
  ];
  const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: "user", content: "Hi there" }];

  test("chat completions, 4 seeds per choice, streamed and not: finish_reason tool_calls, allowed names, arguments valid", async () => {
    const base = memory.active();
    for (const { choice, allowed } of choices) {
      for (let seed = 0; seed < 4; seed++) {
        const what = `${JSON.stringify(choice)} seed ${seed}`;
        // Thinking off: a random model in the (free-text) thought channel would not come out of it.
        const body = {
          model: MODEL,
          messages,
          tools: FORCED_TOOLS,
          tool_choice: choice,
          max_tokens: 300,
          temperature: 1,
          seed,
          reasoning_effort: "none" as const,
        };
        const r = await client.chat.completions.create(body);
        const c = r.choices[0]!;
        expect(c.finish_reason, `${what}: ${JSON.stringify(c.message)}`).toBe("tool_calls");
        expect(c.message.content, what).toBeNull();
        checkForced(
          c.message.tool_calls!.map((t) => {
            const f = (t as OpenAI.ChatCompletionMessageFunctionToolCall).function;
            return { name: f.name, args: JSON.parse(f.arguments) };
          }),
          allowed,
          what,
        );
        const stream = await client.chat.completions.create({ ...body, seed: seed + 100, stream: true });
        const calls: { name: string; args: string }[] = [];
        let finish: string | null = null;
        for await (const chunk of stream) {
          const d = chunk.choices[0]?.delta;
          expect(d?.content ?? "", what).toBe("");
          for (const tc of d?.tool_calls ?? []) {
            calls[tc.index] ??= { name: "", args: "" };
            calls[tc.index]!.name += tc.function?.name ?? "";
            calls[tc.index]!.args += tc.function?.arguments ?? "";
          }
          finish = chunk.choices[0]?.finish_reason ?? finish;
        }
        expect(finish, what).toBe("tool_calls");
        checkForced(
          calls.map((x) => ({ name: x.name, args: JSON.parse(x.args) })),
          allowed,
          `${what} streamed`,
        );
      }
    }
    // n > 1: every choice its own grammar.
    const n = await client.chat.completions.create({
      model: MODEL,
      messages,
      tools: FORCED_TOOLS,
      tool_choice: "required",
      max_tokens: 300,
      temperature: 1,
      seed: 7,
      n: 3,
      reasoning_effort: "none",
    });
    for (const c of n.choices) expect(c.finish_reason).toBe("tool_calls");
    expect(memory.active()).toBeLessThanOrEqual(base + 1024);
  }, 300_000);

  test("Anthropic Messages: tool_choice any and tool, streamed and not: stop_reason tool_use, valid tool_use inputs; disable_parallel_tool_use writes one", async () => {
    const tools: Anthropic.Tool[] = FORCED_TOOLS.map((t) => ({ name: t.function.name, input_schema: t.function.parameters as Anthropic.Tool.InputSchema }));
    const anthropicChoices: { choice: Anthropic.ToolChoice; allowed: string[] }[] = [
      { choice: { type: "any" }, allowed: ["get_weather", "ping"] },
      { choice: { type: "tool", name: "get_weather" }, allowed: ["get_weather"] },
      { choice: { type: "any", disable_parallel_tool_use: true }, allowed: ["get_weather", "ping"] },
    ];
    for (const { choice, allowed } of anthropicChoices) {
      for (let k = 0; k < 3; k++) {
        const what = `${JSON.stringify(choice)} #${k}`;
        const body = { model: MODEL, max_tokens: 1000, tools, tool_choice: choice, messages: [{ role: "user" as const, content: "Hi there" }] };
        const m = k % 2 ? await anthropic.messages.stream(body).finalMessage() : await anthropic.messages.create(body);
        expect(m.stop_reason, `${what}: ${JSON.stringify(m.content).slice(0, 2000)}`).toBe("tool_use");
        const uses = m.content.filter((b) => b.type === "tool_use");
        expect(
          m.content.filter((b) => b.type === "text"),
          what,
        ).toEqual([]);
        if ("disable_parallel_tool_use" in choice) expect(uses, what).toHaveLength(1);
        checkForced(
          uses.map((u) => ({ name: u.name, args: u.input })),
          allowed,
          what,
        );
      }
    }
  }, 300_000);

  test("Responses: tool_choice required and a named function, streamed and not: function_call items only, valid arguments", async () => {
    const tools: OpenAI.Responses.FunctionTool[] = FORCED_TOOLS.map((t) => ({
      type: "function",
      name: t.function.name,
      parameters: t.function.parameters!,
      strict: false,
    }));
    const responseChoices: { choice: OpenAI.Responses.ResponseCreateParams["tool_choice"]; allowed: string[] }[] = [
      { choice: "required", allowed: ["get_weather", "ping"] },
      { choice: { type: "function", name: "ping" }, allowed: ["ping"] },
    ];
    for (const { choice, allowed } of responseChoices) {
      for (let k = 0; k < 3; k++) {
        const what = `${JSON.stringify(choice)} #${k}`;
        const body = { model: MODEL, input: "Hi there", tools, tool_choice: choice, max_output_tokens: 1000, reasoning: { effort: "none" as const } };
        const r = k % 2 ? await client.responses.stream(body).finalResponse() : await client.responses.create(body);
        expect(r.status, what).toBe("completed");
        expect(
          r.output.map((o) => o.type),
          what,
        ).toEqual(r.output.map(() => "function_call"));
        checkForced(
          r.output.map((o) => {
            const f = o as OpenAI.Responses.ResponseFunctionToolCall;
            return { name: f.name, args: JSON.parse(f.arguments) };
          }),
          allowed,
          what,
        );
      }
    }
  }, 300_000);

  test("thinking on: the model may think first, then must call (scripted thought + call through the grammar); a name Gemma 4 cannot write is a 400", async () => {
    // The script's mask and the grammar's both apply: the script goes through only if the grammar allows every token.
    scripts.push("<|channel>thought\nI should ping.<channel|><|tool_call>call:ping{loud:true}<tool_call|>");
    const r = await client.chat.completions.create({
      model: MODEL,
      messages,
      tools: FORCED_TOOLS,
      tool_choice: { type: "function", function: { name: "ping" } },
      max_tokens: 100,
      temperature: 0,
      reasoning_effort: "high",
    });
    const c = r.choices[0]!;
    expect(seen.at(-1)!.promptIds.at(-1)).not.toBe(engine.loaded.tokenizer.tokenToId("<channel|>"));
    expect(c.finish_reason).toBe("tool_calls");
    expect((c.message as { reasoning_content?: string }).reasoning_content).toBe("\nI should ping.");
    const f = (c.message.tool_calls![0] as OpenAI.ChatCompletionMessageFunctionToolCall).function;
    expect([f.name, JSON.parse(f.arguments)]).toEqual(["ping", { loud: true }]);
    const bad = await fetch(`${srv.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ messages, tools: [{ type: "function", function: { name: "a.b", parameters: { type: "object" } } }], tool_choice: "required" }),
    });
    expect(bad.status).toBe(400);
    const err = ((await bad.json()) as { error: { param: string; message: string } }).error;
    expect(err.param).toBe("tools");
    expect(err.message).toContain("a.b");
  }, 300_000);
});
