// OpenAI's Responses API (/v1/responses) through the official `openai` npm client: string and item
// input, instructions, streaming (the SDK's ResponseStream checks the event sequence), reasoning
// items, function tools and function_call_output, previous_response_id and store, retrieval,
// max_output_tokens, and errors. The tiny random model is made to write fixed outputs.
import type { Engine } from "@mlx-bun/runtime";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { chatPromptIds } from "../src/prompt.ts";
import type { RunningServer } from "../src/server/http.ts";
import { type ScriptedServer, type ScriptedSink, startScriptedServer } from "./scripted.ts";

let fx: ScriptedServer;
let engine: Engine;
let sink: ScriptedSink;
let srv: RunningServer;
let client: OpenAI;
const MODEL = "tiny";

beforeAll(() => {
  fx = startScriptedServer("mlxb-responses-", MODEL);
  ({ engine, sink, srv } = fx);
  client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: "not-needed", maxRetries: 0 });
});

afterAll(() => fx?.stop());

const Q = '<|"|>';
const CALL = `<|tool_call>call:get_weather{city:${Q}Paris${Q},days:3}<tool_call|>`;
const ARGS = { city: "Paris", days: 3 };
const TOOLS: OpenAI.Responses.FunctionTool[] = [
  {
    type: "function",
    name: "get_weather",
    description: "Weather for a city",
    parameters: { type: "object", properties: { city: { type: "string" }, days: { type: "integer" } } },
    strict: false,
  },
];
const CHAT_TOOLS = [{ type: "function", function: { name: "get_weather", description: "Weather for a city", parameters: TOOLS[0]!.parameters } }];
const THINK = "<|channel>thought\nThe user greets me.<channel|>Hello!";
const prompt = (messages: Record<string, unknown>[], tools: unknown[] | null = null) => chatPromptIds(engine.loaded, messages as never, { tools });

describe("OpenAI Responses", () => {
  test("string input and instructions: a message item, output_text, usage", async () => {
    sink.scripts.push("Hello there!");
    const r = await client.responses.create({ model: MODEL, input: "Hi", instructions: "Be brief.", max_output_tokens: 50 });
    expect(r.id).toMatch(/^resp_[0-9a-f]{32}$/);
    expect(r.object).toBe("response");
    expect(r.status).toBe("completed");
    expect(r.model).toBe(MODEL);
    expect(r.output_text).toBe("Hello there!");
    expect(r.output).toHaveLength(1);
    expect(r.output[0]).toMatchObject({
      type: "message",
      role: "assistant",
      status: "completed",
      content: [{ type: "output_text", text: "Hello there!", annotations: [] }],
    });
    expect(r.instructions).toBe("Be brief.");
    const ids = prompt([
      { role: "system", content: "Be brief." },
      { role: "user", content: "Hi" },
    ]);
    expect(sink.seen.at(-1)!.promptIds).toEqual(ids);
    const n = engine.loaded.tokenizer.encode("Hello there!", { addSpecialTokens: false }).length + 1;
    expect(r.usage).toEqual({
      input_tokens: ids.length,
      input_tokens_details: { cached_tokens: 0 },
      output_tokens: n,
      output_tokens_details: { reasoning_tokens: 0 },
      total_tokens: ids.length + n,
    });
  });

  test("streaming: events in order, accumulated by the SDK's ResponseStream", async () => {
    sink.scripts.push("Hello there!");
    const stream = await client.responses.create({ model: MODEL, input: "Hi", stream: true });
    const types: string[] = [];
    const seq: number[] = [];
    let text = "";
    for await (const ev of stream) {
      types.push(ev.type);
      seq.push(ev.sequence_number);
      if (ev.type === "response.output_text.delta") text += ev.delta;
    }
    expect(text).toBe("Hello there!");
    expect(seq).toEqual(seq.map((_, i) => i));
    const deltas = types.filter((t) => t === "response.output_text.delta").length;
    expect(deltas).toBeGreaterThan(1);
    expect(types).toEqual([
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
      ...Array(deltas).fill("response.output_text.delta"),
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.completed",
    ]);
    sink.scripts.push("Hello there!");
    const final = await client.responses.stream({ model: MODEL, input: "Hi" }).finalResponse();
    expect(final.status).toBe("completed");
    expect(final.output_text).toBe("Hello there!");
    expect(final.usage!.output_tokens).toBeGreaterThan(1);
  });

  test("reasoning: a reasoning item (reasoning_text, or a summary when asked) before the message", async () => {
    sink.scripts.push(THINK);
    const r = await client.responses.create({ model: MODEL, input: "Hi" });
    expect(r.output.map((o) => o.type)).toEqual(["reasoning", "message"]);
    expect(r.output[0]).toMatchObject({ type: "reasoning", summary: [], content: [{ type: "reasoning_text", text: "\nThe user greets me." }] });
    expect(r.output_text).toBe("Hello!");
    const tok = engine.loaded.tokenizer;
    const gen = tok.encode(THINK, { addSpecialTokens: false });
    expect(r.usage!.output_tokens_details.reasoning_tokens).toBe(gen.indexOf(tok.tokenToId("<channel|>")!) + 1);

    sink.scripts.push(THINK);
    const types: string[] = [];
    const s = client.responses.stream({ model: MODEL, input: "Hi" });
    s.on("event", (ev) => types.push(ev.type));
    const final = await s.finalResponse();
    const shape = (o: OpenAI.Responses.ResponseOutputItem) =>
      o.type === "message"
        ? [o.type, o.content.map((c) => (c.type === "output_text" ? c.text : c.type))]
        : o.type === "reasoning"
          ? [o.type, o.summary, o.content]
          : [o.type];
    expect(final.output.map(shape)).toEqual(r.output.map(shape));
    expect(types).toContain("response.reasoning_text.delta");
    expect(types).toContain("response.reasoning_text.done");

    sink.scripts.push(THINK);
    const sum: string[] = [];
    const s2 = client.responses.stream({ model: MODEL, input: "Hi", reasoning: { effort: "medium", summary: "auto" } });
    s2.on("event", (ev) => sum.push(ev.type));
    const f2 = await s2.finalResponse();
    expect(f2.output[0]).toMatchObject({ type: "reasoning", summary: [{ type: "summary_text", text: "\nThe user greets me." }] });
    expect(sum).toContain("response.reasoning_summary_text.delta");
    expect(f2.reasoning).toEqual({ effort: "medium", summary: "auto" });
    // effort "none" renders the prompt without thinking.
    await client.responses.create({ model: MODEL, input: "Hi", max_output_tokens: 1, reasoning: { effort: "none" } });
    expect(sink.seen.at(-1)!.promptIds).toEqual(chatPromptIds(engine.loaded, [{ role: "user", content: "Hi" }], { kwargs: { enable_thinking: false } }));
  });

  test("function tools: a function_call item, streamed and not; function_call_output through previous_response_id and as items", async () => {
    sink.scripts.push(`Let me check.${CALL}`);
    const r = await client.responses.create({ model: MODEL, input: "Weather in Paris?", tools: TOOLS });
    expect(r.output.map((o) => o.type)).toEqual(["message", "function_call"]);
    const call = r.output[1] as OpenAI.Responses.ResponseFunctionToolCall;
    expect(call.call_id).toMatch(/^call_[0-9a-f]{32}$/);
    expect(call.id).toMatch(/^fc_/);
    expect([call.name, JSON.parse(call.arguments), call.status]).toEqual(["get_weather", ARGS, "completed"]);

    sink.scripts.push(CALL);
    const s = client.responses.stream({ model: MODEL, input: "Weather in Paris?", tools: TOOLS });
    let args = "";
    s.on("response.function_call_arguments.delta", (ev) => {
      args += ev.delta;
    });
    const final = await s.finalResponse();
    expect(JSON.parse(args)).toEqual(ARGS);
    expect(final.output.map((o) => (o.type === "function_call" ? [o.name, JSON.parse(o.arguments)] : o.type))).toEqual([["get_weather", ARGS]]);

    // The tool result, continuing the first response.
    sink.scripts.push("It is sunny.");
    const r2 = await client.responses.create({
      model: MODEL,
      previous_response_id: r.id,
      tools: TOOLS,
      input: [{ type: "function_call_output", call_id: call.call_id, output: '{"temperature": 21}' }],
    });
    expect(r2.output_text).toBe("It is sunny.");
    expect(r2.previous_response_id).toBe(r.id);
    const expected = prompt(
      [
        { role: "user", content: "Weather in Paris?" },
        {
          role: "assistant",
          content: "Let me check.",
          tool_calls: [{ id: call.call_id, type: "function", function: { name: "get_weather", arguments: ARGS } }],
        },
        { role: "tool", tool_call_id: call.call_id, name: "get_weather", content: '{"temperature": 21}' },
      ],
      CHAT_TOOLS,
    );
    expect(sink.seen.at(-1)!.promptIds).toEqual(expected);
    expect(engine.loaded.tokenizer.decode(expected)).toContain("response:get_weather{value:");

    // The same conversation sent whole as items.
    sink.scripts.push("It is sunny.");
    await client.responses.create({
      model: MODEL,
      tools: TOOLS,
      input: [
        { role: "user", content: "Weather in Paris?" },
        { type: "message", role: "assistant", content: [{ type: "output_text", text: "Let me check.", annotations: [] }] } as never,
        { type: "function_call", call_id: call.call_id, name: "get_weather", arguments: JSON.stringify(ARGS) },
        { type: "function_call_output", call_id: call.call_id, output: '{"temperature": 21}' },
      ],
    });
    expect(sink.seen.at(-1)!.promptIds).toEqual(expected);

    // parallel_tool_calls false keeps the first call.
    sink.scripts.push(`${CALL}${CALL}`);
    const one = await client.responses.create({ model: MODEL, input: "Weather?", tools: TOOLS, parallel_tool_calls: false });
    expect(one.output.filter((o) => o.type === "function_call")).toHaveLength(1);
  });

  test("previous_response_id: the conversation goes on (instructions do not carry over); store false; retrieve and delete", async () => {
    sink.scripts.push("Hello!");
    const r1 = await client.responses.create({ model: MODEL, input: "Hi", instructions: "Be brief." });
    sink.scripts.push("Fine.");
    const r2 = await client.responses.create({ model: MODEL, input: "And you?", previous_response_id: r1.id });
    expect(r2.output_text).toBe("Fine.");
    expect(sink.seen.at(-1)!.promptIds).toEqual(
      prompt([
        { role: "user", content: "Hi" },
        { role: "assistant", content: "Hello!" },
        { role: "user", content: "And you?" },
      ]),
    );
    sink.scripts.push("Bye.");
    await client.responses.create({
      model: MODEL,
      input: [{ role: "user", content: [{ type: "input_text", text: "Bye" }] }],
      previous_response_id: r2.id,
      instructions: "Be nice.",
    });
    expect(sink.seen.at(-1)!.promptIds).toEqual(
      prompt([
        { role: "system", content: "Be nice." },
        { role: "user", content: "Hi" },
        { role: "assistant", content: "Hello!" },
        { role: "user", content: "And you?" },
        { role: "assistant", content: "Fine." },
        { role: "user", content: "Bye" },
      ]),
    );
    const got = await client.responses.retrieve(r1.id);
    expect([got.id, got.output_text]).toEqual([r1.id, "Hello!"]);
    const streamed = await fetch(`${srv.url}/v1/responses/${r1.id}?stream=true`);
    expect([streamed.status, ((await streamed.json()) as { error: { param: string } }).error.param]).toEqual([400, "stream"]);

    sink.scripts.push("Gone.");
    const unstored = await client.responses.create({ model: MODEL, input: "Hi", store: false });
    expect((unstored as unknown as { store: boolean }).store).toBe(false);
    for (const id of [unstored.id, "resp_nope"]) {
      const e = await client.responses.create({ model: MODEL, input: "x", previous_response_id: id }).catch((x: unknown) => x);
      expect(e).toBeInstanceOf(OpenAI.BadRequestError);
      expect(e).toMatchObject({ status: 400, code: "previous_response_not_found", param: "previous_response_id" });
    }
    await client.responses.delete(r1.id);
    const e404 = await client.responses.retrieve(r1.id).catch((x: unknown) => x);
    expect(e404).toBeInstanceOf(OpenAI.NotFoundError);
  });

  test("max_output_tokens: status incomplete, reason max_output_tokens", async () => {
    sink.scripts.push("one two three four five six");
    const r = await client.responses.create({ model: MODEL, input: "Count", max_output_tokens: 3 });
    expect(r.status).toBe("incomplete");
    expect(r.incomplete_details).toEqual({ reason: "max_output_tokens" });
    expect(r.usage!.output_tokens).toBe(3);
    expect(r.max_output_tokens).toBe(3);
    sink.scripts.push("one two three four five six");
    const types: string[] = [];
    const s = await client.responses.create({ model: MODEL, input: "Count", max_output_tokens: 3, stream: true });
    for await (const ev of s) types.push(ev.type);
    expect(types.at(-1)).toBe("response.incomplete");
  });

  test("errors: OpenAI's shape, naming the field", async () => {
    const cases: [Record<string, unknown>, string, string][] = [
      [{ input: "Hi", foo: 1 }, "foo", "unknown_parameter"],
      [{}, "input", "missing_required_parameter"],
      [{ input: 3 }, "input", "invalid_type"],
      [{ input: [{ role: "user", content: [{ type: "input_image", image_url: "x" }] }] }, "input[0].content[0].image_url", "model_not_multimodal"],
      [{ input: [{ role: "user", content: [{ type: "input_image", file_id: "file_1" }] }] }, "input[0].content[0].file_id", "unsupported_parameter"],
      [{ input: [{ type: "function_call_output", call_id: "call_x", output: "1" }] }, "input[0].call_id", "invalid_value"],
      [{ input: "Hi", tools: [{ type: "web_search" }] }, "tools[0].type", "unsupported_parameter"],
      [{ input: "Hi", tools: [{ type: "function", name: "f", strict: true }] }, "tools[0].strict", "unsupported_parameter"],
      [{ input: "Hi", temperature: 3 }, "temperature", "invalid_value"],
      [{ input: "Hi", max_output_tokens: 0 }, "max_output_tokens", "invalid_value"],
      [{ input: "Hi", text: { format: { type: "json_object" } } }, "text.format", "unsupported_parameter"],
      [{ input: "Hi", reasoning: { effort: "extreme" } }, "reasoning.effort", "invalid_value"],
      [{ input: "Hi", tools: TOOLS, tool_choice: { type: "function", name: "nope" } }, "tool_choice", "invalid_value"],
      [{ input: "Hi", conversation: "conv_1" }, "conversation", "unsupported_parameter"],
      [{ input: "Hi", include: ["reasoning.encrypted_content"] }, "include", "unsupported_parameter"],
    ];
    for (const [body, param, code] of cases) {
      const res = await fetch(`${srv.url}/v1/responses`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: MODEL, ...body }),
      });
      const j = (await res.json()) as { error: { param: string; code: string; type: string; message: string } };
      expect(j.error, JSON.stringify(body)).toBeTruthy();
      expect([res.status, j.error.param, j.error.code, j.error.type], JSON.stringify(body)).toEqual([400, param, code, "invalid_request_error"]);
    }
    const e = await client.responses.create({ model: "nope", input: "Hi" }).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(OpenAI.NotFoundError);
    expect((await fetch(`${srv.url}/v1/responses`)).status).toBe(405);
  });
});
