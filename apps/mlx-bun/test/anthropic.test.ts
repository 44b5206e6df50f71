// Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) through the official
// @anthropic-ai/sdk client: text, streaming (the event sequence), thinking blocks, a forced tool_use
// and its tool_result back through the chat template, stop sequences, max_tokens, count_tokens
// equal to the prompt, x-api-key, and errors in Anthropic's shape. The tiny random model is made
// to write fixed outputs (test/scripted.ts).
import Anthropic, { type APIError } from "@anthropic-ai/sdk";
import { type Engine, type LogitsProcessor, maskIds, type Scheduler } from "@mlx-bun/runtime";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { chatPromptIds } from "../src/prompt.ts";
import { thinkingBudget } from "../src/server/anthropic.ts";
import type { RunningServer } from "../src/server/http.ts";
import { type ScriptedServer, type ScriptedSink, startScriptedServer } from "./scripted.ts";

let fx: ScriptedServer;
let engine: Engine;
let scheduler: Scheduler;
let sink: ScriptedSink;
let srv: RunningServer;
let keyed: RunningServer;
let client: Anthropic;
const MODEL = "tiny";

beforeAll(() => {
  fx = startScriptedServer("mlxb-anthropic-", MODEL);
  ({ engine, scheduler, sink, srv } = fx);
  keyed = fx.also({ apiKey: "sk-ant-test" });
  client = new Anthropic({ baseURL: srv.url, apiKey: "not-needed", maxRetries: 0 });
});

afterAll(() => fx?.stop());

const Q = '<|"|>';
const CALL = `<|tool_call>call:get_weather{city:${Q}Paris${Q},days:3}<tool_call|>`;
const ARGS = { city: "Paris", days: 3 };
const TOOLS: Anthropic.Tool[] = [
  {
    name: "get_weather",
    description: "Weather for a city",
    input_schema: { type: "object", properties: { city: { type: "string" }, days: { type: "integer" } }, required: ["city"] },
  },
];
const OPENAI_TOOLS = [{ type: "function", function: { name: "get_weather", description: "Weather for a city", parameters: TOOLS[0]!.input_schema } }];
const THINK = "<|channel>thought\nThe user greets me.<channel|>Hello!";

async function raw(path: string, body: unknown, headers: Record<string, string> = {}, method = "POST", base = srv.url) {
  const res = await fetch(`${base}${path}`, {
    method,
    headers: { "content-type": "application/json", ...headers },
    ...(method === "POST" ? { body: typeof body === "string" ? body : JSON.stringify(body) } : {}),
  });
  return { status: res.status, body: (await res.json()) as { type: string; error: { type: string; message: string } } };
}

describe("Anthropic Messages", () => {
  test("text: content block, end_turn, usage; the prompt is the chat template's without thinking", async () => {
    sink.scripts.push("Hello there!");
    const m = await client.messages.create({ model: MODEL, max_tokens: 50, system: "Be brief.", messages: [{ role: "user", content: "Hi" }] });
    expect(m.id).toMatch(/^msg_[0-9a-f]{32}$/);
    expect(m.type).toBe("message");
    expect(m.role).toBe("assistant");
    expect(m.model).toBe(MODEL);
    expect(m.content).toEqual([{ type: "text", text: "Hello there!" }]);
    expect(m.stop_reason).toBe("end_turn");
    expect(m.stop_sequence).toBeNull();
    const prompt = chatPromptIds(
      engine.loaded,
      [
        { role: "system", content: "Be brief." },
        { role: "user", content: "Hi" },
      ],
      { kwargs: { enable_thinking: false } },
    );
    expect(sink.seen.at(-1)!.promptIds).toEqual(prompt);
    expect(m.usage.input_tokens + (m.usage.cache_read_input_tokens ?? 0)).toBe(prompt.length);
    const n = engine.loaded.tokenizer.encode("Hello there!", { addSpecialTokens: false }).length;
    expect(m.usage.output_tokens).toBe(n + 1); // and the end-of-turn token
  });

  test("streaming: Anthropic's event sequence, accumulated by the SDK's MessageStream", async () => {
    sink.scripts.push("Hello there!");
    const stream = await client.messages.create({ model: MODEL, max_tokens: 50, messages: [{ role: "user", content: "Hi" }], stream: true });
    const types: string[] = [];
    let text = "";
    let stop: string | null = null;
    for await (const ev of stream) {
      types.push(ev.type === "content_block_delta" ? `delta:${ev.delta.type}` : ev.type);
      if (ev.type === "content_block_delta" && ev.delta.type === "text_delta") text += ev.delta.text;
      if (ev.type === "message_delta") stop = ev.delta.stop_reason;
    }
    expect(text).toBe("Hello there!");
    expect(stop).toBe("end_turn");
    const deltas = types.filter((t) => t === "delta:text_delta").length;
    expect(deltas).toBeGreaterThan(1);
    expect(types).toEqual([
      "message_start",
      "content_block_start",
      ...Array(deltas).fill("delta:text_delta"),
      "content_block_stop",
      "message_delta",
      "message_stop",
    ]);

    sink.scripts.push("Hello there!");
    const ms = client.messages.stream({ model: MODEL, max_tokens: 50, messages: [{ role: "user", content: "Hi" }] });
    const final = await ms.finalMessage();
    expect(final.content).toEqual([{ type: "text", text: "Hello there!" }]);
    expect(final.stop_reason).toBe("end_turn");
    expect(final.usage.output_tokens).toBeGreaterThan(1);
  });

  test("thinking enabled: a thinking block before the text, streamed (thinking_delta) and not", async () => {
    sink.scripts.push(THINK);
    const m = await client.messages.create({
      model: MODEL,
      max_tokens: 2000,
      thinking: { type: "enabled", budget_tokens: 1024 },
      messages: [{ role: "user", content: "Hi" }],
    });
    expect(m.content).toEqual([
      { type: "thinking", thinking: "\nThe user greets me.", signature: "" },
      { type: "text", text: "Hello!" },
    ]);
    expect(sink.seen.at(-1)!.promptIds).toEqual(chatPromptIds(engine.loaded, [{ role: "user", content: "Hi" }], { kwargs: { enable_thinking: true } }));
    sink.scripts.push(THINK);
    const ms = client.messages.stream({
      model: MODEL,
      max_tokens: 2000,
      thinking: { type: "enabled", budget_tokens: 1024 },
      messages: [{ role: "user", content: "Hi" }],
    });
    const kinds: string[] = [];
    ms.on("streamEvent", (ev) => {
      if (ev.type === "content_block_start") kinds.push(`start:${ev.content_block.type}:${ev.index}`);
      if (ev.type === "content_block_delta") kinds.push(ev.delta.type);
    });
    const final = await ms.finalMessage();
    expect(final.content).toEqual(m.content);
    expect(kinds[0]).toBe("start:thinking:0");
    expect(kinds).toContain("thinking_delta");
    expect(kinds).toContain("start:text:1");
    expect(kinds.at(-1)).toBe("text_delta");
    // display "omitted": the block is there, its text is not.
    sink.scripts.push(THINK);
    const o = await client.messages.create({
      model: MODEL,
      max_tokens: 2000,
      thinking: { type: "adaptive", display: "omitted" },
      messages: [{ role: "user", content: "Hi" }],
    });
    expect(o.content).toEqual([
      { type: "thinking", thinking: "", signature: "" },
      { type: "text", text: "Hello!" },
    ]);
    // "disabled" renders the prompt without thinking.
    await client.messages.create({ model: MODEL, max_tokens: 1, thinking: { type: "disabled" }, messages: [{ role: "user", content: "Hi" }] });
    expect(sink.seen.at(-1)!.promptIds).toEqual(chatPromptIds(engine.loaded, [{ role: "user", content: "Hi" }], { kwargs: { enable_thinking: false } }));
  });

  test("tool_use: forced call, streamed (input_json_delta) and not; tool_result goes back through the template", async () => {
    const messages: Anthropic.MessageParam[] = [{ role: "user", content: "Weather in Paris?" }];
    sink.scripts.push(`Let me check.${CALL}`);
    const m = await client.messages.create({ model: MODEL, max_tokens: 200, tools: TOOLS, messages });
    expect(m.stop_reason).toBe("tool_use");
    expect(m.content).toHaveLength(2);
    expect(m.content[0]).toEqual({ type: "text", text: "Let me check." });
    const use = m.content[1] as Anthropic.ToolUseBlock;
    expect(use.type).toBe("tool_use");
    expect(use.id).toMatch(/^toolu_[0-9a-f]{32}$/);
    expect([use.name, use.input]).toEqual(["get_weather", ARGS]);

    sink.scripts.push(CALL);
    const ms = client.messages.stream({ model: MODEL, max_tokens: 200, tools: TOOLS, messages });
    const json: string[] = [];
    ms.on("inputJson", (partial) => json.push(partial));
    const final = await ms.finalMessage();
    expect(final.stop_reason).toBe("tool_use");
    expect(final.content.map((b) => (b.type === "tool_use" ? [b.name, b.input] : b.type))).toEqual([["get_weather", ARGS]]);
    expect(JSON.parse(json.join(""))).toEqual(ARGS);

    // The round trip: the assistant turn as returned, then the result.
    sink.scripts.push("It is sunny.");
    const history: Anthropic.MessageParam[] = [
      ...messages,
      { role: "assistant", content: m.content },
      { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: '{"temperature": 21}' }] },
    ];
    const r2 = await client.messages.create({ model: MODEL, max_tokens: 50, tools: TOOLS, messages: history });
    expect(r2.content).toEqual([{ type: "text", text: "It is sunny." }]);
    expect(r2.stop_reason).toBe("end_turn");
    const expected = chatPromptIds(
      engine.loaded,
      [
        { role: "user", content: "Weather in Paris?" },
        { role: "assistant", content: "Let me check.", tool_calls: [{ id: use.id, type: "function", function: { name: "get_weather", arguments: ARGS } }] },
        { role: "tool", tool_call_id: use.id, name: "get_weather", content: '{"temperature": 21}' },
      ],
      { tools: OPENAI_TOOLS, kwargs: { enable_thinking: false } },
    );
    expect(sink.seen.at(-1)!.promptIds).toEqual(expected);
    const text = engine.loaded.tokenizer.decode(expected);
    expect(text).toContain('<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>');
    expect(text).toContain('response:get_weather{value:<|"|>{"temperature": 21}<|"|>}');

    // disable_parallel_tool_use keeps the first call only; tool_choice none bans the opening.
    sink.scripts.push(`${CALL}${CALL}`);
    const one = await client.messages.create({
      model: MODEL,
      max_tokens: 200,
      tools: TOOLS,
      tool_choice: { type: "auto", disable_parallel_tool_use: true },
      messages,
    });
    expect(one.content.filter((b) => b.type === "tool_use")).toHaveLength(1);
    sink.scripts.push(`${CALL}${CALL}`);
    const two = await client.messages.create({ model: MODEL, max_tokens: 200, tools: TOOLS, messages });
    expect(two.content.filter((b) => b.type === "tool_use")).toHaveLength(2);
  });

  test("stop_sequences, max_tokens, sampling fields", async () => {
    sink.scripts.push("Hello STOP world");
    const s = await client.messages.create({ model: MODEL, max_tokens: 50, stop_sequences: ["STOP", "never"], messages: [{ role: "user", content: "Hi" }] });
    expect(s.content).toEqual([{ type: "text", text: "Hello " }]);
    expect([s.stop_reason, s.stop_sequence]).toEqual(["stop_sequence", "STOP"]);
    sink.scripts.push("Hello STOP world");
    const ss = await client.messages
      .stream({ model: MODEL, max_tokens: 50, stop_sequences: ["STOP"], messages: [{ role: "user", content: "Hi" }] })
      .finalMessage();
    expect([ss.stop_reason, ss.stop_sequence]).toEqual(["stop_sequence", "STOP"]);
    sink.scripts.push("one two three four five six");
    const l = await client.messages.create({ model: MODEL, max_tokens: 3, messages: [{ role: "user", content: "Hi" }] });
    expect(l.stop_reason).toBe("max_tokens");
    expect(l.usage.output_tokens).toBe(3);
    await client.messages.create({
      model: MODEL,
      max_tokens: 2,
      messages: [{ role: "user", content: "Hi" }],
      temperature: 0.7,
      top_p: 0.9,
      top_k: 5,
      metadata: { user_id: "u-1" },
    } as Anthropic.MessageCreateParamsNonStreaming);
    expect(sink.seen.at(-1)!.sampling).toMatchObject({ temperature: 0.7, topP: 0.9, topK: 5 });
  });

  test("count_tokens equals the prompt of the same request", async () => {
    const req = { model: MODEL, system: "You check the weather.", tools: TOOLS, messages: [{ role: "user" as const, content: "Weather in Paris?" }] };
    const c = await client.messages.countTokens(req);
    sink.scripts.push("Sunny.");
    const m = await client.messages.create({ ...req, max_tokens: 20 });
    expect(c.input_tokens).toBe(sink.seen.at(-1)!.promptIds.length);
    expect(c.input_tokens).toBe(m.usage.input_tokens + (m.usage.cache_read_input_tokens ?? 0));
    const t = await client.messages.countTokens({ ...req, thinking: { type: "enabled", budget_tokens: 1024 } });
    expect(t.input_tokens).toBe(
      chatPromptIds(
        engine.loaded,
        [
          { role: "system", content: "You check the weather." },
          { role: "user", content: "Weather in Paris?" },
        ],
        { tools: OPENAI_TOOLS, kwargs: { enable_thinking: true } },
      ).length,
    );
  });

  test("x-api-key on a server with --api-key; errors in Anthropic's shape, naming the field", async () => {
    const ok = new Anthropic({ baseURL: keyed.url, apiKey: "sk-ant-test", maxRetries: 0 });
    sink.scripts.push("Hi!");
    expect((await ok.messages.create({ model: MODEL, max_tokens: 10, messages: [{ role: "user", content: "Hi" }] })).content).toEqual([
      { type: "text", text: "Hi!" },
    ]);
    const wrong = new Anthropic({ baseURL: keyed.url, apiKey: "sk-wrong", maxRetries: 0 });
    const e401 = await wrong.messages.create({ model: MODEL, max_tokens: 10, messages: [{ role: "user", content: "Hi" }] }).catch((e: unknown) => e);
    expect(e401).toBeInstanceOf(Anthropic.AuthenticationError);
    expect((e401 as APIError).error).toMatchObject({ type: "error", error: { type: "authentication_error" } });
    // x-api-key also opens the OpenAI endpoints of a keyed server.
    expect((await fetch(`${keyed.url}/v1/models`, { headers: { "x-api-key": "sk-ant-test" } })).status).toBe(200);

    const e404 = await client.messages.create({ model: "claude-nope", max_tokens: 10, messages: [{ role: "user", content: "Hi" }] }).catch((e: unknown) => e);
    expect(e404).toBeInstanceOf(Anthropic.NotFoundError);
    expect((e404 as APIError).error).toMatchObject({ type: "error", error: { type: "not_found_error" } });

    const cases: [unknown, string][] = [
      [{ model: MODEL, messages: [{ role: "user", content: "Hi" }] }, "max_tokens: Field required"],
      [{ model: MODEL, max_tokens: 0, messages: [{ role: "user", content: "Hi" }] }, "max_tokens:"],
      [{ model: MODEL, max_tokens: 5, temperature: 1.5, messages: [{ role: "user", content: "Hi" }] }, "temperature:"],
      [{ model: MODEL, max_tokens: 5, top_k: "x", messages: [{ role: "user", content: "Hi" }] }, "top_k:"],
      [{ model: MODEL, max_tokens: 5, messages: [{ role: "user", content: "Hi" }], frequency_penalty: 1 }, "frequency_penalty: Extra inputs are not permitted"],
      [
        { model: MODEL, max_tokens: 5, messages: [{ role: "user", content: "Hi" }], metadata: { user_id: "u", other: 1 } },
        "metadata.other: Extra inputs are not permitted",
      ],
      [{ model: MODEL, max_tokens: 5, messages: [{ role: "user", content: "Hi" }], mcp_servers: [{ type: "url" }] }, "mcp_servers:"],
      [
        {
          model: MODEL,
          max_tokens: 5,
          messages: [{ role: "user", content: [{ type: "image", source: { type: "base64", media_type: "image/png", data: "" } }] }],
        },
        "messages.0.content.0.source: the model 'tiny' has no vision tower",
      ],
      [{ model: MODEL, max_tokens: 5, messages: [{ role: "robot", content: "Hi" }] }, "messages.0.role:"],
      [
        {
          model: MODEL,
          max_tokens: 5,
          messages: [
            { role: "user", content: "Hi" },
            { role: "assistant", content: "Sure" },
          ],
        },
        "messages.1:",
      ],
      [
        { model: MODEL, max_tokens: 5, messages: [{ role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_x", content: "1" }] }] },
        "messages.0.content.0.tool_use_id:",
      ],
      [{ model: MODEL, max_tokens: 5, tools: [{ name: "t" }], messages: [{ role: "user", content: "Hi" }] }, "tools.0.input_schema:"],
      [
        { model: MODEL, max_tokens: 5, tools: [{ type: "web_search_20250305", name: "web_search" }], messages: [{ role: "user", content: "Hi" }] },
        "tools.0.type:",
      ],
      [
        { model: MODEL, max_tokens: 5, tools: TOOLS, tool_choice: { type: "tool", name: "nope" }, messages: [{ role: "user", content: "Hi" }] },
        "tool_choice.name:",
      ],
      [
        { model: MODEL, max_tokens: 2000, thinking: { type: "enabled", budget_tokens: 100 }, messages: [{ role: "user", content: "Hi" }] },
        "thinking.budget_tokens:",
      ],
      [
        { model: MODEL, max_tokens: 1500, thinking: { type: "enabled", budget_tokens: 1500 }, messages: [{ role: "user", content: "Hi" }] },
        "thinking.budget_tokens: must be less than max_tokens",
      ],
      [{ model: MODEL, max_tokens: 5, stop_sequences: "STOP", messages: [{ role: "user", content: "Hi" }] }, "stop_sequences:"],
      [{ model: MODEL, max_tokens: 5 }, "messages: Field required"],
      ["{not json", "Invalid JSON"],
    ];
    for (const [body, msg] of cases) {
      const r = await raw("/v1/messages", body);
      expect([r.status, r.body.type, r.body.error.type], JSON.stringify(body)).toEqual([400, "error", "invalid_request_error"]);
      expect(r.body.error.message, JSON.stringify(body)).toContain(msg);
    }
    // The SDK surfaces them as BadRequestError with Anthropic's body.
    const e400 = await client.messages
      .create({ model: MODEL, max_tokens: 5, messages: [{ role: "user", content: "Hi" }], temperature: 3 } as Anthropic.MessageCreateParamsNonStreaming)
      .catch((e: unknown) => e);
    expect(e400).toBeInstanceOf(Anthropic.BadRequestError);
    expect((e400 as APIError).error).toMatchObject({
      type: "error",
      error: { type: "invalid_request_error", message: expect.stringContaining("temperature") },
    });
    const ct = await raw("/v1/messages/count_tokens", { model: MODEL, max_tokens: 5, messages: [{ role: "user", content: "Hi" }] });
    expect([ct.status, ct.body.error.message]).toEqual([400, "max_tokens: Extra inputs are not permitted"]);
    const get = await raw("/v1/messages", null, {}, "GET");
    expect([get.status, get.body.type]).toEqual([405, "error"]);
  });
});

describe("thinking budget (thinking.budget_tokens)", () => {
  /** Forces `ids` first, then leaves the model free. */
  function forcePrefix(ids: readonly number[]): LogitsProcessor {
    let base = -1;
    return {
      process(history, logits) {
        if (base < 0) base = history.length;
        const k = history.length - base;
        if (k >= ids.length) return logits.retain();
        const V = logits.shape[logits.ndim - 1]!;
        return maskIds(
          logits,
          Array.from({ length: V }, (_, i) => i).filter((i) => i !== ids[k]),
        );
      },
    };
  }

  test("closes the thinking channel once the budget is spent", async () => {
    const tok = engine.loaded.tokenizer;
    const open = [tok.tokenToId("<|channel>")!];
    const close = tok.tokenToId("<channel|>")!;
    const eos = [...tok.eosTokenIds];
    const promptIds = chatPromptIds(engine.loaded, [{ role: "user", content: "Hi" }], { kwargs: { enable_thinking: true } });
    const run = async (budget: number | null) => {
      const processors = [forcePrefix(open)];
      if (budget !== null) processors.push(thinkingBudget(tok, budget)!);
      // No end of turn, so the run is as long as asked.
      const s = scheduler.submit({
        promptIds,
        maxTokens: 12,
        sampling: { temperature: 0, logitBias: Object.fromEntries(eos.map((id) => [id, -1e9])) },
        keepSpecialTokens: true,
        logitsProcessors: processors,
      });
      return (await s.result).tokens;
    };
    const free = await run(null);
    const capped = await run(5);
    // <|channel> (forced), then 5 tokens inside, then the forced close.
    expect(capped.slice(0, 6)).toEqual(free.slice(0, 6));
    expect(capped[6]).toBe(close);
    expect(free[6]).not.toBe(close);
    expect(capped.slice(7)).not.toContain(close);
  });
});
