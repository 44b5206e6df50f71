// GET /metrics (Prometheus text format) after requests to each endpoint: the request counters by
// endpoint and status, token counters equal to the responses' usage, latency histograms, the
// scheduler's gauges and the prompt cache's hits and reused tokens equal to its own stats.
import { join } from "node:path";
import { Engine, PromptCache, Scheduler } from "@mlx-bun/runtime";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { type RunningServer, startServer } from "../src/server/http.ts";
import { makeTinySmall, tempDir } from "./helpers.ts";

let tmp: ReturnType<typeof tempDir>;
let engine: Engine;
let cache: PromptCache;
let scheduler: Scheduler;
let srv: RunningServer;
let keyed: RunningServer;
let client: OpenAI;
const MODEL = "tiny";

beforeAll(() => {
  tmp = tempDir("mlxb-metrics-");
  const dir = makeTinySmall(join(tmp.path, "tiny"));
  engine = Engine.load(dir);
  cache = new PromptCache({ maxEntries: 10, maxBytes: 1 << 30 });
  scheduler = new Scheduler(engine, { maxBatch: 4, promptCache: cache });
  srv = startServer({ model: engine.loaded, scheduler, modelId: MODEL, port: 0, webDir: null });
  keyed = startServer({ model: engine.loaded, scheduler, modelId: MODEL, port: 0, webDir: null, apiKey: "sk-m" });
  client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: "x", maxRetries: 0 });
});

afterAll(async () => {
  await srv?.stop();
  await keyed?.stop();
  await scheduler?.close();
  cache?.dispose();
  engine?.dispose();
  tmp?.cleanup();
});

/** Samples of a Prometheus text exposition: "name{labels}" → value. */
function parse(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const at = line.lastIndexOf(" ");
    out.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return out;
}

describe("GET /metrics", () => {
  test("counters after chat, Anthropic and Responses requests, errors, prompt-cache reuse", async () => {
    const chat = { model: MODEL, messages: [{ role: "user" as const, content: "Tell me a story about a cat" }], max_tokens: 6, temperature: 0 };
    const c1 = await client.chat.completions.create(chat);
    const c2 = await client.chat.completions.create(chat); // the same prompt: served from the prompt cache
    expect(c2.usage!.prompt_tokens_details!.cached_tokens).toBeGreaterThan(0);
    const a = (await (
      await fetch(`${srv.url}/v1/messages`, {
        method: "POST",
        body: JSON.stringify({ model: MODEL, max_tokens: 4, messages: [{ role: "user", content: "Hi" }] }),
      })
    ).json()) as {
      usage: { input_tokens: number; cache_read_input_tokens: number; output_tokens: number };
    };
    let responsesUsage: OpenAI.Responses.ResponseUsage | undefined;
    const stream = await client.responses.create({ model: MODEL, input: "Hello", max_output_tokens: 3, stream: true });
    for await (const ev of stream) if (ev.type === "response.completed" || ev.type === "response.incomplete") responsesUsage = ev.response.usage!;
    expect((await fetch(`${srv.url}/nope`)).status).toBe(404);
    expect((await fetch(`${srv.url}/v1/chat/completions`, { method: "POST", body: JSON.stringify({ messages: [] }) })).status).toBe(400);

    const res = await fetch(`${srv.url}/metrics`);
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toContain("text/plain");
    const text = await res.text();
    expect(text).toContain("# TYPE mlx_bun_http_requests_total counter");
    expect(text).toContain("# TYPE mlx_bun_time_to_first_token_seconds histogram");
    const m = parse(text);
    const get = (k: string) => m.get(k);
    expect(get('mlx_bun_http_requests_total{endpoint="/v1/chat/completions",method="POST",status="200"}')).toBe(2);
    expect(get('mlx_bun_http_requests_total{endpoint="/v1/chat/completions",method="POST",status="400"}')).toBe(1);
    expect(get('mlx_bun_http_requests_total{endpoint="/v1/messages",method="POST",status="200"}')).toBe(1);
    expect(get('mlx_bun_http_requests_total{endpoint="/v1/responses",method="POST",status="200"}')).toBe(1);
    expect(get('mlx_bun_http_requests_total{endpoint="other",method="GET",status="404"}')).toBe(1);

    const chatEp = 'endpoint="/v1/chat/completions"';
    expect(get(`mlx_bun_prompt_tokens_total{${chatEp}}`)).toBe(c1.usage!.prompt_tokens + c2.usage!.prompt_tokens);
    expect(get(`mlx_bun_generation_tokens_total{${chatEp}}`)).toBe(c1.usage!.completion_tokens + c2.usage!.completion_tokens);
    expect(get(`mlx_bun_prompt_tokens_cached_total{${chatEp}}`)).toBe(
      c1.usage!.prompt_tokens_details!.cached_tokens! + c2.usage!.prompt_tokens_details!.cached_tokens!,
    );
    expect(get('mlx_bun_prompt_tokens_total{endpoint="/v1/messages"}')).toBe(a.usage.input_tokens + a.usage.cache_read_input_tokens);
    expect(get('mlx_bun_generation_tokens_total{endpoint="/v1/messages"}')).toBe(a.usage.output_tokens);
    expect(get('mlx_bun_prompt_tokens_total{endpoint="/v1/responses"}')).toBe(responsesUsage!.input_tokens);
    expect(get('mlx_bun_generation_tokens_total{endpoint="/v1/responses"}')).toBe(responsesUsage!.output_tokens);
    expect(get(`mlx_bun_requests_finished_total{${chatEp},finish_reason="length"}`)).toBe(2);

    expect(get(`mlx_bun_time_to_first_token_seconds_count{${chatEp}}`)).toBe(2);
    expect(get(`mlx_bun_time_to_first_token_seconds_bucket{le="+Inf",${chatEp}}`)).toBe(2);
    expect(get(`mlx_bun_time_to_first_token_seconds_sum{${chatEp}}`)).toBeGreaterThan(0);
    expect(get(`mlx_bun_time_per_output_token_seconds_count{${chatEp}}`)).toBe(2);

    expect(get("mlx_bun_prompt_cache_hits_total")).toBe(cache.stats.hits);
    expect(get("mlx_bun_prompt_cache_hits_total")).toBeGreaterThanOrEqual(1);
    expect(get("mlx_bun_prompt_cache_misses_total")).toBe(cache.stats.misses);
    expect(get("mlx_bun_prompt_cache_cached_tokens_total")).toBe(cache.stats.cachedTokens);
    expect(get("mlx_bun_prompt_cache_cached_tokens_total")).toBeGreaterThanOrEqual(c2.usage!.prompt_tokens_details!.cached_tokens!);
    expect(get("mlx_bun_prompt_cache_entries")).toBe(cache.size);
    expect(get("mlx_bun_batch_size")).toBe(0);
    expect(get("mlx_bun_active_requests")).toBe(0);
    expect(get("mlx_bun_memory_active_bytes")).toBeGreaterThan(0);

    // The scrape itself is counted by the next one.
    const again = parse(await (await fetch(`${srv.url}/metrics`)).text());
    expect(again.get('mlx_bun_http_requests_total{endpoint="/metrics",method="GET",status="200"}')).toBe(1);
  });

  test("needs the API key when the server has one", async () => {
    expect((await fetch(`${keyed.url}/metrics`)).status).toBe(401);
    const ok = await fetch(`${keyed.url}/metrics`, { headers: { authorization: "Bearer sk-m" } });
    expect(ok.status).toBe(200);
    expect(await ok.text()).toContain("mlx_bun_batch_size");
    expect((await fetch(`${keyed.url}/metrics`, { method: "POST" })).status).toBe(401);
    expect((await fetch(`${srv.url}/metrics`, { method: "POST" })).status).toBe(405);
  });

  test("a scheduler without a prompt cache: no prompt-cache metrics (rather than zeros)", async () => {
    const plain = new Scheduler(engine, { maxBatch: 2 });
    const s = startServer({ model: engine.loaded, scheduler: plain, modelId: MODEL, port: 0, webDir: null });
    try {
      const text = await (await fetch(`${s.url}/metrics`)).text();
      expect(text).toContain("mlx_bun_batch_size 0");
      expect(text).not.toContain("mlx_bun_prompt_cache");
    } finally {
      await s.stop();
      await plain.close();
    }
  });
});
