// response_format over HTTP on a tiny checkpoint: json_schema and json_object, streamed and not,
// through the official `openai` client and raw HTTP; n choices each with its own grammar; 400s in
// OpenAI's error shape (param "response_format") for schemas the grammar cannot enforce, for a
// schema that aborts XGrammar's converter (later requests unaffected), and on /v1/completions.
import { join } from "node:path";
import { Engine, Scheduler } from "@mlx-bun/runtime";
import Ajv2020 from "ajv/dist/2020.js";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { type RunningServer, startServer } from "../src/server/http.ts";
import { makeTinySmall, tempDir } from "./helpers.ts";

let tmp: ReturnType<typeof tempDir>;
let engine: Engine;
let scheduler: Scheduler;
let srv: RunningServer;
let client: OpenAI;
const MODEL = "tiny-org/tiny";

beforeAll(() => {
  tmp = tempDir("mlxb-structured-");
  engine = Engine.load(makeTinySmall(join(tmp.path, "tiny")));
  scheduler = new Scheduler(engine, { maxBatch: 16 });
  srv = startServer({ model: engine.loaded, scheduler, modelId: MODEL, port: 0 });
  client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: "not-needed", maxRetries: 0 });
});

afterAll(async () => {
  await srv?.stop();
  await scheduler?.close();
  engine?.dispose();
  tmp?.cleanup();
});

const ajv = new Ajv2020({ strict: false });
const SCHEMA = {
  type: "object",
  properties: {
    city: { type: "string", minLength: 1, maxLength: 10 },
    population: { type: "integer", minimum: 0, maximum: 100000 },
    coastal: { type: "boolean" },
    tags: { type: "array", items: { enum: ["old", "new", "big"] }, maxItems: 2 },
  },
  required: ["city", "population", "coastal"],
  additionalProperties: false,
};
const validate = ajv.compile(SCHEMA);
const jsonSchema = (schema: unknown = SCHEMA) => ({ type: "json_schema", json_schema: { name: "city", schema, strict: true } });
const messages = [{ role: "user" as const, content: "Describe a city as JSON." }];

async function post(path: string, body: unknown) {
  return await fetch(`${srv.url}${path}`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
}

async function streamed(body: Record<string, unknown>) {
  const res = await post("/v1/chat/completions", { ...body, stream: true });
  expect(res.status).toBe(200);
  const events = (await res.text())
    .split("\n\n")
    .filter((l) => l.startsWith("data: ") && l !== "data: [DONE]")
    .map((l) => JSON.parse(l.slice(6)) as { choices: { index: number; delta: { content?: string }; finish_reason: string | null }[] });
  const text = new Map<number, string>();
  const finish = new Map<number, string | null>();
  for (const e of events) {
    for (const c of e.choices) {
      text.set(c.index, (text.get(c.index) ?? "") + (c.delta.content ?? ""));
      if (c.finish_reason) finish.set(c.index, c.finish_reason);
    }
  }
  return { text, finish };
}

describe("json_schema", () => {
  test("not streamed (openai client), greedy and seeded: the content parses and validates", async () => {
    for (const sampling of [{ temperature: 0 }, { temperature: 1, seed: 7 }]) {
      const r = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 200, response_format: jsonSchema() as never, ...sampling });
      const c = r.choices[0]!;
      expect(c.finish_reason).toBe("stop");
      const v = JSON.parse(c.message.content!);
      expect(validate(v), c.message.content!).toBe(true);
    }
  });

  test("streamed: the deltas join to the same validated JSON as the whole response", async () => {
    const body = { model: MODEL, messages, max_tokens: 200, temperature: 0, response_format: jsonSchema() };
    const whole = (await (await post("/v1/chat/completions", body)).json()) as { choices: { message: { content: string } }[] };
    const s = await streamed(body);
    expect(s.finish.get(0)).toBe("stop");
    expect(s.text.get(0)).toBe(whole.choices[0]!.message.content);
    expect(validate(JSON.parse(s.text.get(0)!))).toBe(true);
  });

  test("n = 3 seeded choices, streamed: each choice has its own grammar and validates", async () => {
    const s = await streamed({ model: MODEL, messages, max_tokens: 200, temperature: 1, seed: 3, n: 3, response_format: jsonSchema() });
    expect([...s.text.keys()].sort()).toEqual([0, 1, 2]);
    for (const [i, t] of s.text) {
      expect(s.finish.get(i)).toBe("stop");
      expect(validate(JSON.parse(t)), t).toBe(true);
    }
  });

  test('{"type": "text"} is the plain output', async () => {
    const a = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 12, temperature: 0, response_format: { type: "text" } });
    const b = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 12, temperature: 0 });
    expect(a.choices[0]!.message.content).toBe(b.choices[0]!.message.content);
  });
});

describe("json_object", () => {
  test("not streamed and streamed: a JSON object, the same text both ways", async () => {
    // Any object: keys and values are unbounded, so a seed with which the random model finishes.
    const body = { model: MODEL, messages, max_tokens: 80, temperature: 1, seed: 11, response_format: { type: "json_object" } };
    const whole = (await (await post("/v1/chat/completions", body)).json()) as { choices: { message: { content: string }; finish_reason: string }[] };
    const c = whole.choices[0]!;
    expect(c.finish_reason).toBe("stop");
    const v = JSON.parse(c.message.content);
    expect(typeof v === "object" && v !== null && !Array.isArray(v)).toBe(true);
    const s = await streamed(body);
    expect(s.text.get(0)).toBe(c.message.content);
    expect(s.finish.get(0)).toBe(c.finish_reason);
  });
});

describe("bad requests", () => {
  async function error(path: string, body: unknown) {
    const res = await post(path, body);
    const j = (await res.json()) as { error: { message: string; type: string; param: string | null; code: string | null } };
    return { status: res.status, ...j.error };
  }

  test("an unsupported schema feature is a 400 naming it and where it is", async () => {
    const schema = { type: "object", properties: { tags: { type: "array", items: { type: "string" }, uniqueItems: true } } };
    const e = await error("/v1/chat/completions", { model: MODEL, messages, response_format: jsonSchema(schema) });
    expect(e.status).toBe(400);
    expect(e.type).toBe("invalid_request_error");
    expect(e.param).toBe("response_format");
    expect(e.message).toContain("uniqueItems");
    expect(e.message).toContain("/properties/tags/uniqueItems");
    // the openai client raises it as a BadRequestError
    await expect(
      client.chat.completions.create({ model: MODEL, messages, response_format: jsonSchema({ type: "string", format: "ipv6" }) as never }),
    ).rejects.toMatchObject({ status: 400 });
  });

  test("a schema that aborts XGrammar's converter is a 400, and the next request works", async () => {
    const e = await error("/v1/chat/completions", { model: MODEL, messages, response_format: jsonSchema({ type: "string", pattern: "(|a)" }) });
    expect(e.status).toBe(400);
    expect(e.param).toBe("response_format");
    expect(e.message).toMatch(/EBNF parser error/);
    const r = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 200, temperature: 0, response_format: jsonSchema() as never });
    expect(validate(JSON.parse(r.choices[0]!.message.content!))).toBe(true);
  });

  test("malformed response_format fields are 400s; unknown fields are not ignored", async () => {
    for (const rf of [
      "json",
      { type: "xml" },
      { type: "json_schema" },
      { type: "json_schema", json_schema: { schema: SCHEMA } },
      { type: "json_schema", json_schema: { name: "a b", schema: SCHEMA } },
      { type: "json_schema", json_schema: { name: "x", schema: SCHEMA, strict: "yes" } },
      { type: "json_schema", json_schema: { name: "x", schema: SCHEMA, extra: 1 } },
      { type: "json_object", schema: SCHEMA },
      { type: "json_schema", json_schema: { name: "x", schema: [1] } },
    ]) {
      const e = await error("/v1/chat/completions", { model: MODEL, messages, response_format: rf });
      expect(e.status, JSON.stringify(rf)).toBe(400);
      expect(e.param).toBe("response_format");
    }
  });

  test("response_format with tools is refused (the grammar would forbid the tool call)", async () => {
    const tools = [{ type: "function", function: { name: "f", parameters: { type: "object", properties: {} } } }];
    const e = await error("/v1/chat/completions", { model: MODEL, messages, tools, response_format: { type: "json_object" } });
    expect(e.status).toBe(400);
    expect(e.param).toBe("response_format");
    const ok = await post("/v1/chat/completions", {
      model: MODEL,
      messages,
      tools,
      tool_choice: "none",
      max_tokens: 200,
      temperature: 0,
      response_format: jsonSchema(),
    });
    expect(ok.status).toBe(200);
  });

  test("/v1/completions does not take response_format (as OpenAI and mlx_lm.server)", async () => {
    const e = await error("/v1/completions", { model: MODEL, prompt: "x", response_format: { type: "json_object" } });
    expect(e.status).toBe(400);
    expect(e.param).toBe("response_format");
  });

  test("nothing is left running", async () => {
    for (let i = 0; i < 200 && scheduler.active > 0; i++) await Bun.sleep(10);
    expect(scheduler.active).toBe(0);
  });
});
