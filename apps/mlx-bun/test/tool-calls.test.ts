// Gemma 4 tool calls and thinking through the server, with the official npm and Python `openai`
// clients. The tiny random model is made to write a fixed output (a logits processor that allows
// one token per step, injected where requests enter the scheduler), so the server's parsing,
// streaming deltas, finish_reason and the tool-result round trip are what is tested.
import { join } from "node:path";
import { Engine, type GenerateRequest, Scheduler } from "@mlx-bun/runtime";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { runPython, runPythonAsync } from "../../../tools/oracle/oracle.ts";
import { chatPromptIds } from "../src/prompt.ts";
import { type RunningServer, startServer } from "../src/server/http.ts";
import { makeTinySmall, tempDir } from "./helpers.ts";
import { scriptedSink } from "./scripted.ts";

let tmp: ReturnType<typeof tempDir>;
let dir: string;
let engine: Engine;
let scheduler: Scheduler;
let srv: RunningServer;
let client: OpenAI;
/** What the next requests are made to write (FIFO), and every request submitted. */
let scripts: string[];
let seen: GenerateRequest[];
const MODEL = "tiny";

beforeAll(() => {
  tmp = tempDir("mlxb-tools-");
  dir = makeTinySmall(join(tmp.path, "tiny"));
  engine = Engine.load(dir);
  scheduler = new Scheduler(engine, { maxBatch: 4 });
  const sink = scriptedSink(engine, scheduler);
  scripts = sink.scripts;
  seen = sink.seen;
  srv = startServer({ model: engine.loaded, scheduler: sink, modelId: MODEL, port: 0 });
  client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: "not-needed", maxRetries: 0 });
});

afterAll(async () => {
  await srv?.stop();
  await scheduler?.close();
  engine?.dispose();
  tmp?.cleanup();
});

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
