// The server on a tiny checkpoint, through the official `openai` client and raw HTTP: chat and
// completions (streaming and not), stop, logprobs, seeds; greedy tokens identical to
// `mlx-bun generate --json` and to mlx-lm; 16 concurrent requests equal to their solo runs,
// cancellations that leave the others alone, bad requests, and memory back to baseline.
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { splitGemma4Output } from "@mlx-bun/models";
import { Engine, Scheduler } from "@mlx-bun/runtime";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { runPython } from "../../../tools/oracle/oracle.ts";
import { chatPromptIds, generatePromptIds } from "../src/prompt.ts";
import { type RunningServer, startServer } from "../src/server/http.ts";
import { makeTinySmall, runCli, tempDir } from "./helpers.ts";

let tmp: ReturnType<typeof tempDir>;
let dir: string;
let engine: Engine;
let scheduler: Scheduler;
let srv: RunningServer;
let keyed: RunningServer;
let client: OpenAI;
const MODEL = "tiny-org/tiny";
const MAX_BODY = 256 * 1024;

beforeAll(() => {
  tmp = tempDir("mlxb-server-");
  dir = makeTinySmall(join(tmp.path, "tiny"));
  engine = Engine.load(dir);
  scheduler = new Scheduler(engine, { maxBatch: 16 });
  srv = startServer({ model: engine.loaded, scheduler, modelId: MODEL, modelAliases: [dir], port: 0, maxBodyBytes: MAX_BODY });
  keyed = startServer({ model: engine.loaded, scheduler, modelId: MODEL, port: 0, apiKey: "sk-test-123" });
  client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: "not-needed", maxRetries: 0 });
});

afterAll(async () => {
  await srv?.stop();
  await keyed?.stop();
  await scheduler?.close();
  engine?.dispose();
  tmp?.cleanup();
});

type Lp = { content: { id: number; token: string; logprob: number; top_logprobs: { id: number; logprob: number }[] }[] };
const ids = (choice: { logprobs?: unknown }) => ((choice.logprobs as Lp | null)?.content ?? []).map((e) => e.id);

async function chatIds(content: string, maxTokens: number, extra: Record<string, unknown> = {}) {
  const r = await client.chat.completions.create({
    model: MODEL,
    messages: [{ role: "user", content }],
    max_tokens: maxTokens,
    temperature: 0,
    logprobs: true,
    ...extra,
  } as never);
  const c = (r as OpenAI.ChatCompletion).choices[0]!;
  return { ids: ids(c), text: c.message.content ?? "", finish: c.finish_reason, usage: (r as OpenAI.ChatCompletion).usage! };
}

async function post(path: string, body: unknown, init: RequestInit = {}, base = srv.url) {
  const res = await fetch(`${base}${path}`, {
    method: "POST",
    headers: { "Content-Type": "application/json", ...(init.headers as Record<string, string>) },
    body: typeof body === "string" ? body : JSON.stringify(body),
    ...(init.signal ? { signal: init.signal } : {}),
  });
  return res;
}

async function health(): Promise<{ status: string; active_requests: number; memory: { active_bytes: number } }> {
  return (await fetch(`${srv.url}/health`)).json() as never;
}

async function idle(): Promise<void> {
  for (let i = 0; i < 500 && (scheduler.active > 0 || (await health()).active_requests > 0); i++) await Bun.sleep(10);
  expect(scheduler.active).toBe(0);
}

describe("endpoints", () => {
  test("/v1/models and /health", async () => {
    const models = await client.models.list();
    expect(models.data.map((m) => m.id)).toEqual([MODEL]);
    expect((await client.models.retrieve(MODEL)).id).toBe(MODEL);
    const h = await health();
    expect(h.status).toBe("ok");
    expect(h.active_requests).toBe(0);
    expect(typeof h.memory.active_bytes).toBe("number");
  });

  test("chat, not streamed: content, finish reason, usage", async () => {
    const r = await client.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "hello there" }], max_tokens: 12 });
    const promptIds = chatPromptIds(engine.loaded, [{ role: "user", content: "hello there" }]);
    expect(r.object).toBe("chat.completion");
    expect(r.id).toMatch(/^chatcmpl-/);
    expect(r.model).toBe(MODEL);
    expect(r.choices[0]!.message.role).toBe("assistant");
    expect(typeof r.choices[0]!.message.content).toBe("string");
    expect(["stop", "length"]).toContain(r.choices[0]!.finish_reason);
    expect(r.usage!.prompt_tokens).toBe(promptIds.length);
    expect(r.usage!.completion_tokens).toBeGreaterThan(0);
    expect(r.usage!.completion_tokens).toBeLessThanOrEqual(12);
    expect(r.usage!.total_tokens).toBe(r.usage!.prompt_tokens + r.usage!.completion_tokens);
  });

  test("chat, streamed: the deltas add up to the whole answer; usage chunk with include_usage", async () => {
    const whole = await chatIds("tell me a story", 16);
    const stream = await client.chat.completions.create({
      model: MODEL,
      messages: [{ role: "user", content: "tell me a story" }],
      max_tokens: 16,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = "";
    let finish: string | null = null;
    let usage: OpenAI.CompletionUsage | undefined;
    let chunks = 0;
    for await (const c of stream) {
      chunks++;
      expect(c.object).toBe("chat.completion.chunk");
      if (c.usage) usage = c.usage;
      const ch = c.choices[0];
      if (!ch) continue;
      text += ch.delta.content ?? "";
      if (ch.finish_reason) finish = ch.finish_reason;
    }
    expect(chunks).toBeGreaterThan(2);
    expect(text).toBe(whole.text);
    expect(finish).toBe(whole.finish);
    expect(usage).toEqual(whole.usage);
  });

  test("completions, streamed and not", async () => {
    const r = await client.completions.create({ model: MODEL, prompt: "Once upon a time", max_tokens: 10 });
    expect(r.object).toBe("text_completion");
    expect(r.id).toMatch(/^cmpl-/);
    const promptIds = engine.loaded.tokenizer.encode("Once upon a time");
    expect(r.usage!.prompt_tokens).toBe(promptIds.length);
    const stream = await client.completions.create({ model: MODEL, prompt: "Once upon a time", max_tokens: 10, stream: true });
    let text = "";
    let finish: string | null = null;
    for await (const c of stream) {
      text += c.choices[0]?.text ?? "";
      finish = c.choices[0]?.finish_reason ?? finish;
    }
    expect(text).toBe(r.choices[0]!.text);
    expect(finish).toBe(r.choices[0]!.finish_reason);
    // Token-id prompts give the same answer.
    const byIds = await client.completions.create({ model: MODEL, prompt: promptIds, max_tokens: 10 });
    expect(byIds.choices[0]!.text).toBe(r.choices[0]!.text);
  });

  test("stop strings end the answer before the stop, streamed and not", async () => {
    const g = await chatIds("hello there", 24);
    let at = Math.floor(g.text.length / 2);
    while (at < g.text.length - 2 && /\ufffd/.test(g.text.slice(at, at + 2))) at++;
    const stop = g.text.slice(at, at + 2);
    expect(stop.length).toBe(2);
    const want = g.text.slice(0, g.text.indexOf(stop));
    const r = await client.chat.completions.create({
      model: MODEL,
      messages: [{ role: "user", content: "hello there" }],
      max_tokens: 24,
      stop: [stop, "never-appears"],
    });
    expect(r.choices[0]!.message.content ?? "").toBe(want);
    expect(r.choices[0]!.finish_reason).toBe("stop");
    const s = await client.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "hello there" }], max_tokens: 24, stop, stream: true });
    let text = "";
    let finish: string | null = null;
    for await (const c of s) {
      text += c.choices[0]?.delta.content ?? "";
      finish = c.choices[0]?.finish_reason ?? finish;
    }
    expect(text).toBe(want);
    expect(finish).toBe("stop");
  });

  test("logprobs: the chosen token's and the top alternatives, greedy picks the top one", async () => {
    const r = await client.chat.completions.create({
      model: MODEL,
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 8,
      logprobs: true,
      top_logprobs: 3,
    });
    const lp = r.choices[0]!.logprobs as unknown as Lp;
    expect(lp.content).toHaveLength(r.usage!.completion_tokens);
    for (const e of lp.content) {
      expect(e.top_logprobs).toHaveLength(3);
      expect(e.logprob).toBeLessThanOrEqual(0);
      const tops = e.top_logprobs.map((t) => t.logprob);
      expect([...tops].sort((a, b) => b - a)).toEqual(tops);
      expect(e.top_logprobs[0]!.id).toBe(e.id);
      expect(e.top_logprobs[0]!.logprob).toBeCloseTo(e.logprob, 6);
      expect(typeof e.token).toBe("string");
    }
    // Legacy completions shape alongside.
    const c = await client.completions.create({ model: MODEL, prompt: "hi", max_tokens: 4, logprobs: 2 });
    const l = c.choices[0]!.logprobs!;
    expect(l.tokens).toHaveLength(c.usage!.completion_tokens);
    expect(l.token_logprobs).toHaveLength(c.usage!.completion_tokens);
    expect(Object.keys(l.top_logprobs![0]!).length).toBeGreaterThanOrEqual(1);
  });

  test("tools and chat_template_kwargs reach the chat template", async () => {
    const messages = [{ role: "user" as const, content: "what is the weather?" }];
    const tools = [
      {
        type: "function" as const,
        function: { name: "get_weather", description: "Weather of a city", parameters: { type: "object", properties: { city: { type: "string" } } } },
      },
    ];
    const plain = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 2 });
    const withTools = await client.chat.completions.create({ model: MODEL, messages, tools, max_tokens: 2 });
    expect(withTools.usage!.prompt_tokens).toBe(chatPromptIds(engine.loaded, messages, { tools }).length);
    expect(withTools.usage!.prompt_tokens).toBeGreaterThan(plain.usage!.prompt_tokens);
    const noThinking = await client.chat.completions.create({
      model: MODEL,
      messages,
      max_tokens: 2,
      chat_template_kwargs: { enable_thinking: false },
    } as never);
    expect((noThinking as OpenAI.ChatCompletion).usage!.prompt_tokens).toBe(
      chatPromptIds(engine.loaded, messages, { kwargs: { enable_thinking: false } }).length,
    );
    expect((noThinking as OpenAI.ChatCompletion).usage!.prompt_tokens).toBeLessThan(plain.usage!.prompt_tokens);
  });

  test("a seed reproduces sampled output; other seeds differ", async () => {
    const sample = async (seed: number) => (await chatIds("write something", 16, { temperature: 1.0, seed })).ids;
    const a = await sample(7);
    const b = await sample(7);
    expect(b).toEqual(a);
    const others = await Promise.all([8, 9, 10].map(sample));
    expect(others.some((o) => JSON.stringify(o) !== JSON.stringify(a))).toBe(true);
    // A seeded request in a batch samples as it does alone.
    const batched = await Promise.all([sample(7), chatIds("other", 16), sample(7)]);
    expect(batched[0]).toEqual(a);
    expect(batched[2]).toEqual(a);
  });
});

describe("n > 1 and XTC", () => {
  type Choice = { index: number; finish_reason: string; message?: { content: string | null }; text?: string; logprobs: Lp | null };
  type Body = { object: string; choices: Choice[]; usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number } };
  const msgs = [{ role: "user", content: "write a poem" }];
  const chat = async (extra: Record<string, unknown>): Promise<Body> => {
    const res = await post("/v1/chat/completions", { model: MODEL, messages: msgs, max_tokens: 12, logprobs: true, ...extra });
    expect(res.status).toBe(200);
    return (await res.json()) as Body;
  };
  /** The SSE chunks of a streamed request, as parsed JSON (without [DONE]). */
  const sse = async (path: string, body: Record<string, unknown>) => {
    const res = await post(path, { model: MODEL, stream: true, ...body });
    expect(res.status).toBe(200);
    const lines = (await res.text()).split("\n\n").filter((l) => l.startsWith("data: "));
    expect(lines.at(-1)).toBe("data: [DONE]");
    return lines.slice(0, -1).map((l) => JSON.parse(l.slice(6)) as { choices: (Choice & { delta?: { content?: string } })[]; usage?: Body["usage"] });
  };

  test("chat, not streamed: n choices, index 0..n-1, seeded choice i = seed + i, usage sums the completions", async () => {
    const r = await chat({ n: 3, temperature: 1, seed: 5 });
    expect(r.choices.map((c) => c.index)).toEqual([0, 1, 2]);
    const solo = await Promise.all([5, 6, 7].map((seed) => chat({ temperature: 1, seed })));
    r.choices.forEach((c, i) => {
      expect(ids(c), `choice ${i}`).toEqual(ids(solo[i]!.choices[0]!));
      expect(c.message!.content).toBe(solo[i]!.choices[0]!.message!.content);
    });
    expect(new Set(r.choices.map((c) => JSON.stringify(ids(c)))).size).toBeGreaterThan(1);
    const promptTokens = chatPromptIds(engine.loaded, msgs).length;
    const completion = r.choices.reduce((n, c) => n + ids(c).length, 0);
    expect(r.usage).toMatchObject({ prompt_tokens: promptTokens, completion_tokens: completion, total_tokens: promptTokens + completion });
    // Reproducible as a whole.
    expect((await chat({ n: 3, temperature: 1, seed: 5 })).choices.map(ids)).toEqual(r.choices.map(ids));
  });

  test("greedy n > 1 gives n identical choices (through the openai client)", async () => {
    const one = await chatIds("write a poem", 12);
    const steps0 = scheduler.stats.decodeSteps;
    const r = await client.chat.completions.create({
      model: MODEL,
      messages: [{ role: "user", content: "write a poem" }],
      max_tokens: 12,
      temperature: 0,
      n: 4,
      logprobs: true,
    });
    expect(r.choices).toHaveLength(4);
    for (const c of r.choices) expect(ids(c)).toEqual(one.ids);
    expect(r.usage!.completion_tokens).toBe(4 * one.ids.length);
    // The choices were decoded together: about one step per token, not four.
    expect(scheduler.stats.decodeSteps - steps0).toBeLessThan(2 * one.ids.length);
  });

  test("chat, streamed: every chunk names its choice; each choice streams its whole answer and one finish", async () => {
    const whole = await chat({ n: 3, temperature: 1, seed: 11 });
    const chunks = await sse("/v1/chat/completions", {
      messages: msgs,
      max_tokens: 12,
      n: 3,
      temperature: 1,
      seed: 11,
      stream_options: { include_usage: true },
    });
    const text = ["", "", ""];
    const finishes: string[][] = [[], [], []];
    for (const c of chunks.slice(0, -1)) {
      expect(c.choices).toHaveLength(1);
      const ch = c.choices[0]!;
      text[ch.index] += ch.delta?.content ?? "";
      if (ch.finish_reason) finishes[ch.index]!.push(ch.finish_reason);
    }
    whole.choices.forEach((c, i) => {
      expect(text[i], `choice ${i}`).toBe(c.message!.content ?? "");
      expect(finishes[i]).toEqual([c.finish_reason]);
    });
    const last = chunks.at(-1)!;
    expect(last.choices).toEqual([]);
    expect(last.usage).toEqual(whole.usage);
  });

  test("completions, streamed and not, with n = 2", async () => {
    const res = await post("/v1/completions", { model: MODEL, prompt: "Once upon a time", max_tokens: 8, n: 2, temperature: 0.9, seed: 3 });
    const r = (await res.json()) as Body;
    expect(r.object).toBe("text_completion");
    expect(r.choices.map((c) => c.index)).toEqual([0, 1]);
    const chunks = await sse("/v1/completions", { prompt: "Once upon a time", max_tokens: 8, n: 2, temperature: 0.9, seed: 3 });
    const text = ["", ""];
    for (const c of chunks) for (const ch of c.choices) text[ch.index] += ch.text ?? "";
    expect(text).toEqual(r.choices.map((c) => c.text));
    expect(new Set(chunks.flatMap((c) => c.choices.map((ch) => ch.index)))).toEqual(new Set([0, 1]));
  });

  test("xtc_probability / xtc_threshold are accepted and sample reproducibly; the threshold reaches the sampler", async () => {
    const xtc = async (t: number) => ids((await chat({ temperature: 1, seed: 21, xtc_probability: 0.5, xtc_threshold: t })).choices[0]!);
    const a = await xtc(0.004);
    expect(a.length).toBeGreaterThan(0);
    expect(await xtc(0.004)).toEqual(a);
    // The tiny model's top probability is about 0.02: 0.5 never removes a token, 0.004 does.
    expect(await xtc(0.5)).not.toEqual(a);
    const res = await post("/v1/chat/completions", { model: MODEL, messages: msgs, xtc_probability: 0.5, xtc_threshold: 0.7 });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: { param: string } }).error.param).toBe("xtc_threshold");
    await idle();
  });
});

describe("greedy parity", () => {
  test("mlx-bun generate --json, the server and mlx-lm produce the same tokens", async () => {
    const N = 24;
    const cases = [
      { prompt: "hello there", system_prompt: null, ignore_chat_template: false },
      { prompt: "Write a poem about the sea", system_prompt: "You are a poet.", ignore_chat_template: false },
      { prompt: "The capital of France is", system_prompt: null, ignore_chat_template: true },
    ];
    const casesFile = join(tmp.path, "cases.json");
    writeFileSync(casesFile, JSON.stringify(cases.map((c) => ({ ...c, max_tokens: N }))));
    const ref = JSON.parse(runPython([join(import.meta.dirname, "mlx_lm_generate.py"), dir, casesFile])) as {
      prompt_ids: number[];
      generated_ids: number[];
      text: string;
    }[];
    for (const [i, c] of cases.entries()) {
      const args = ["generate", "--json", "--model", dir, "--prompt", c.prompt, "--max-tokens", String(N), "--temp", "0"];
      if (c.system_prompt) args.push("--system-prompt", c.system_prompt);
      if (c.ignore_chat_template) args.push("--ignore-chat-template");
      const cli = await runCli(args);
      expect(cli.code, cli.stderr).toBe(0);
      const lines = cli.stdout.trim().split("\n");
      expect(lines).toHaveLength(1);
      const out = JSON.parse(lines[0]!);
      expect(out.prompt_ids, `case ${i} prompt`).toEqual(ref[i]!.prompt_ids);
      expect(out.generated_ids, `case ${i} cli`).toEqual(ref[i]!.generated_ids);
      // generate prints the text as mlx_lm.generate does, special tokens (e.g. "<pad>") included.
      expect(out.text).toBe(ref[i]!.text);
      expect(Object.keys(out.timings)).toEqual(expect.arrayContaining(["prompt_tps", "generation_tps", "ttft_s"]));

      const ours = generatePromptIds(engine.loaded, c.prompt, {
        ignoreChatTemplate: c.ignore_chat_template,
        ...(c.system_prompt ? { systemPrompt: c.system_prompt } : {}),
      });
      expect(ours).toEqual(ref[i]!.prompt_ids);
      let served: number[];
      let text: string;
      if (c.ignore_chat_template) {
        const r = await client.completions.create({ model: MODEL, prompt: c.prompt, max_tokens: N, temperature: 0, logprobs: 0 } as never);
        served = ids((r as OpenAI.Completion).choices[0]!);
        text = (r as OpenAI.Completion).choices[0]!.text;
        expect((r as OpenAI.Completion).usage!.prompt_tokens).toBe(ref[i]!.prompt_ids.length);
      } else {
        const messages = [...(c.system_prompt ? [{ role: "system" as const, content: c.system_prompt }] : []), { role: "user" as const, content: c.prompt }];
        const r = (await client.chat.completions.create({ model: MODEL, messages, max_tokens: N, temperature: 0, logprobs: true })) as OpenAI.ChatCompletion;
        served = ids(r.choices[0]!);
        text = r.choices[0]!.message.content ?? "";
        expect(r.usage!.prompt_tokens).toBe(ref[i]!.prompt_ids.length);
      }
      expect(served, `case ${i} server`).toEqual(ref[i]!.generated_ids);
      // The server keeps special tokens in the text, as mlx_lm.server; chat content is the text without Gemma 4's thinking/tool-call markup.
      expect(text).toBe(c.ignore_chat_template ? ref[i]!.text : (splitGemma4Output(ref[i]!.text).content ?? ""));
    }
  });

  test("plain generate streams the text to stdout and mlx_lm-like stats to stderr, as mlx_lm.generate prints", async () => {
    const py = runPython(["-m", "mlx_lm", "generate", "--model", dir, "--prompt", "hello there", "--max-tokens", "16", "--temp", "0"]);
    const pyText = py.split("==========\n")[1]!.replace(/\n$/, "");
    const r = await runCli(["generate", "--model", dir, "--prompt", "hello there", "--max-tokens", "16"]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toBe(`${pyText}\n`);
    expect(r.stderr).toMatch(/Prompt: \d+ tokens, [\d.]+ tokens-per-sec\nGeneration: 16 tokens, [\d.]+ tokens-per-sec\nPeak memory: [\d.]+ GB/);
  });

  test("seeded XTC: mlx-bun generate --xtc-probability/--xtc-threshold = mlx_lm.generate with the same command line", async () => {
    // mlx_lm.generate seeds before building the model, whose initializers draw from the same global
    // random state; mlx-bun skips as many keys (test/mlx-lm-flags.test.ts checks the count).
    const runs = [
      ["0.5", "0.004"],
      ["1", "0.01"],
    ] as const;
    const argv = (p: string, t: string) => [
      "--model",
      dir,
      "--prompt",
      "hello there",
      "--max-tokens",
      "16",
      "--temp",
      "1",
      "--seed",
      "3",
      "--xtc-probability",
      p,
      "--xtc-threshold",
      t,
    ];
    const casesFile = join(tmp.path, "xtc-cases.json");
    writeFileSync(casesFile, JSON.stringify(runs.map(([p, t]) => ({ command: "generate", argv: argv(p, t) }))));
    const refs = JSON.parse(runPython([join(import.meta.dirname, "mlx_lm_cli.py"), casesFile])) as { error: string | null; runs: { tokens: number[] }[] }[];
    for (const [i, [p, t]] of runs.entries()) {
      const r = await runCli(["generate", "--json", ...argv(p, t)]);
      expect(r.code, r.stderr).toBe(0);
      const out = JSON.parse(r.stdout) as { prompt_ids: number[]; generated_ids: number[] };
      expect(refs[i]!.error).toBeNull();
      expect(out.generated_ids.length).toBeGreaterThan(0);
      expect(out.generated_ids, `xtc ${p} ${t}`).toEqual(refs[i]!.runs[0]!.tokens);
    }
    const bad = await runCli(["generate", "--model", dir, "--xtc-threshold", "0.7"]);
    expect(bad.code).toBe(1);
    expect(bad.stderr).toContain("--xtc-threshold must be in [0, 0.5]");
  });
});

// Prompts of different lengths and answers of different lengths.
const PROMPTS = Array.from({ length: 16 }, (_, i) => ({
  content: `${"request ".repeat(1 + (i % 5))}number ${i}: ${["tell", "show", "write", "say"][i % 4]} something`,
  maxTokens: 6 + ((i * 7) % 19),
}));
const solo: { ids: number[]; text: string }[] = [];

describe("continuous batching", () => {
  test("16 concurrent requests each produce exactly their solo greedy tokens", async () => {
    for (const p of PROMPTS) solo.push(await chatIds(p.content, p.maxTokens));
    let peak = 0;
    const timer = setInterval(() => (peak = Math.max(peak, scheduler.batchSize)), 2);
    const together = await Promise.all(PROMPTS.map((p) => chatIds(p.content, p.maxTokens)));
    clearInterval(timer);
    expect(peak).toBeGreaterThan(1);
    together.forEach((t, i) => {
      expect(t.ids, `request ${i}`).toEqual(solo[i]!.ids);
      expect(t.text).toBe(solo[i]!.text);
    });
    await idle();
  });

  test("clients that disconnect mid-stream are cancelled and the others are undisturbed", async () => {
    expect(solo).toHaveLength(16);
    let rnd = 12345;
    const rand = () => (rnd = (rnd * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
    const plan = PROMPTS.map(() => (rand() < 0.5 ? 1 + Math.floor(rand() * 3) : 0)); // chunks to read before hanging up (0 = read all)
    if (!plan.some((k) => k > 0)) plan[0] = 1;
    const results = await Promise.all(
      PROMPTS.map(async (p, i) => {
        const ac = new AbortController();
        const res = await post(
          "/v1/chat/completions",
          { model: MODEL, messages: [{ role: "user", content: p.content }], max_tokens: p.maxTokens, stream: true, logprobs: true },
          { signal: ac.signal },
        );
        expect(res.status).toBe(200);
        const reader = res.body!.getReader();
        const dec = new TextDecoder();
        let buf = "";
        const got: number[] = [];
        let chunks = 0;
        let done = false;
        try {
          while (!done) {
            const { value, done: eof } = await reader.read();
            if (eof) break;
            buf += dec.decode(value, { stream: true });
            let k: number;
            while ((k = buf.indexOf("\n\n")) >= 0) {
              const ev = buf.slice(0, k);
              buf = buf.slice(k + 2);
              if (!ev.startsWith("data: ")) continue;
              if (ev === "data: [DONE]") {
                done = true;
                break;
              }
              const c = JSON.parse(ev.slice(6));
              for (const e of c.choices[0]?.logprobs?.content ?? []) got.push(e.id);
              chunks++;
              if (plan[i]! > 0 && chunks >= plan[i]!) {
                ac.abort();
                done = true;
                break;
              }
            }
          }
        } catch {
          // the abort
        }
        return { got, cancelled: plan[i]! > 0 };
      }),
    );
    results.forEach((r, i) => {
      if (r.cancelled) expect(solo[i]!.ids.slice(0, r.got.length)).toEqual(r.got);
      else expect(r.got, `request ${i}`).toEqual(solo[i]!.ids);
    });
    await idle();
  });
});

describe("cancellation", () => {
  for (const stream of [true, false]) {
    test(`a client that hangs up stops its request at once (${stream ? "streamed" : "not streamed"})`, async () => {
      const ac = new AbortController();
      const t0 = performance.now();
      const pending = post(
        "/v1/chat/completions",
        { model: MODEL, messages: [{ role: "user", content: "go on and on" }], max_tokens: 3000, stream },
        { signal: ac.signal },
      );
      if (stream) {
        const res = await pending;
        await res.body!.getReader().read();
      } else {
        for (let i = 0; i < 200 && scheduler.batchSize === 0; i++) await Bun.sleep(5);
        expect(scheduler.active).toBe(1);
        await Bun.sleep(50);
      }
      ac.abort();
      await pending.catch(() => {});
      await idle();
      // 3000 tokens would take far longer than this.
      expect(performance.now() - t0).toBeLessThan(5000);
    });
  }
});

describe("bad requests", () => {
  test("each gets its status and OpenAI error JSON, and the server keeps serving", async () => {
    const tok = engine.loaded.tokenizer;
    const ctx = engine.loaded.config.text.maxPositionEmbeddings;
    let long = "";
    for (let i = 0; tok.encode(long).length < ctx + 10; i++) long += `word${i} `.repeat(50);
    expect(Buffer.byteLength(long)).toBeLessThan(MAX_BODY);
    const chat = (extra: Record<string, unknown>) => ({ model: MODEL, messages: [{ role: "user", content: "hi" }], max_tokens: 4, ...extra });
    const cases: [string, () => Promise<Response>, number, string | null][] = [
      ["malformed JSON", () => post("/v1/chat/completions", '{"messages": ['), 400, "invalid_json"],
      ["a JSON array body", () => post("/v1/chat/completions", "[1]"), 400, "invalid_json"],
      ["max_tokens as a string", () => post("/v1/chat/completions", chat({ max_tokens: "4" })), 400, "invalid_type"],
      ["max_tokens 0", () => post("/v1/chat/completions", chat({ max_tokens: 0 })), 400, "invalid_value"],
      ["max_tokens -1 (completions)", () => post("/v1/completions", { prompt: "hi", max_tokens: -1 }), 400, "invalid_value"],
      ["temperature as a string", () => post("/v1/completions", { prompt: "hi", temperature: "hot" }), 400, "invalid_type"],
      ["no messages", () => post("/v1/chat/completions", { model: MODEL }), 400, "missing_required_parameter"],
      [
        "an image part on a model without a vision tower",
        () => post("/v1/chat/completions", { messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "x" } }] }] }),
        400,
        "model_not_multimodal",
      ],
      ["logit_bias outside the vocabulary", () => post("/v1/chat/completions", chat({ logit_bias: { "99999999": 1 } })), 400, "invalid_value"],
      ["an unknown model", () => post("/v1/chat/completions", chat({ model: "gpt-4o" })), 404, "model_not_found"],
      ["a prompt longer than the context", () => post("/v1/chat/completions", { messages: [{ role: "user", content: long }] }), 400, "context_length_exceeded"],
      [
        "a token prompt longer than the context",
        () => post("/v1/completions", { prompt: new Array(ctx).fill(5), max_tokens: 1 }),
        400,
        "context_length_exceeded",
      ],
      ["a body over the limit", () => post("/v1/completions", { prompt: "x".repeat(MAX_BODY + 10) }), 413, "request_too_large"],
      ["an unknown endpoint", () => post("/v1/embeddings", { input: "x" }), 404, "not_found"],
      ["GET on a POST endpoint", () => fetch(`${srv.url}/v1/chat/completions`), 405, "method_not_allowed"],
      ["no API key", () => post("/v1/chat/completions", chat({}), {}, keyed.url), 401, "invalid_api_key"],
      ["a wrong API key", () => post("/v1/chat/completions", chat({}), { headers: { Authorization: "Bearer sk-wrong" } }, keyed.url), 401, "invalid_api_key"],
      ["models without the API key", () => fetch(`${keyed.url}/v1/models`), 401, "invalid_api_key"],
    ];
    for (const [name, send, status, code] of cases) {
      const res = await send();
      expect(res.status, name).toBe(status);
      expect(res.headers.get("content-type"), name).toContain("application/json");
      const body = (await res.json()) as { error: Record<string, unknown> };
      expect(Object.keys(body.error).sort(), name).toEqual(["code", "message", "param", "type"]);
      expect(body.error.code, name).toBe(code);
      expect(body.error.type, name).toBe(status === 401 ? "authentication_error" : "invalid_request_error");
      // Still serving.
      const ok = await post("/v1/chat/completions", chat({}));
      expect(ok.status, `after ${name}`).toBe(200);
      await ok.json();
    }
    await idle();
  });

  test("the openai client sees typed errors; the API key works through it; /health needs no key", async () => {
    await expect(client.chat.completions.create({ model: "gpt-4o", messages: [{ role: "user", content: "hi" }] })).rejects.toBeInstanceOf(OpenAI.NotFoundError);
    await expect(client.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "hi" }], max_tokens: 0 })).rejects.toBeInstanceOf(
      OpenAI.BadRequestError,
    );
    const noKey = new OpenAI({ baseURL: `${keyed.url}/v1`, apiKey: "sk-wrong", maxRetries: 0 });
    await expect(noKey.models.list()).rejects.toBeInstanceOf(OpenAI.AuthenticationError);
    const withKey = new OpenAI({ baseURL: `${keyed.url}/v1`, apiKey: "sk-test-123", maxRetries: 0 });
    const r = await withKey.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "hi" }], max_tokens: 3 });
    expect(r.choices[0]!.message.role).toBe("assistant");
    expect((await fetch(`${keyed.url}/health`)).status).toBe(200);
    // CORS is off by default (--allowed-origins): another origin's preflight is refused
    // (robustness.test.ts covers allowed origins and the Host check).
    const pre = await fetch(`${srv.url}/v1/chat/completions`, {
      method: "OPTIONS",
      headers: { Origin: "http://example.test", "Access-Control-Request-Method": "POST" },
    });
    expect(pre.status).toBe(403);
    expect(pre.headers.get("access-control-allow-origin")).toBeNull();
  });
});

describe("memory", () => {
  test("after 200 mixed requests MLX active memory is back to its baseline", async () => {
    await idle();
    const baseline = (await health()).memory.active_bytes;
    let next = 0;
    const kinds = { ok: 0, bad: 0, cancelled: 0 };
    const one = async (i: number) => {
      const p = PROMPTS[i % PROMPTS.length]!;
      const msg = [{ role: "user", content: p.content }];
      switch (i % 8) {
        case 0:
          await (await post("/v1/chat/completions", { messages: msg, max_tokens: 6 })).json();
          kinds.ok++;
          return;
        case 1:
          await (await post("/v1/chat/completions", { messages: msg, max_tokens: 6, stream: true, stream_options: { include_usage: true } })).text();
          kinds.ok++;
          return;
        case 2:
          await (await post("/v1/completions", { prompt: p.content, max_tokens: 5, logprobs: 2 })).json();
          kinds.ok++;
          return;
        case 3:
          await (await post("/v1/completions", { prompt: p.content, max_tokens: 5, stream: true, temperature: 0.8, seed: i })).text();
          kinds.ok++;
          return;
        case 4:
          await (await post("/v1/chat/completions", { messages: msg, max_tokens: 8, stop: ["o", "e"], top_logprobs: 2 })).json();
          kinds.ok++;
          return;
        case 5: {
          const ac = new AbortController();
          const res = await post("/v1/chat/completions", { messages: msg, max_tokens: 20, stream: true }, { signal: ac.signal });
          const reader = res.body!.getReader();
          await reader.read();
          ac.abort();
          await reader.read().catch(() => {});
          kinds.cancelled++;
          return;
        }
        case 6: {
          const res = await post("/v1/chat/completions", { messages: msg, max_tokens: 0 });
          expect(res.status).toBe(400);
          await res.json();
          kinds.bad++;
          return;
        }
        default:
          await (
            await post("/v1/chat/completions", { messages: msg, max_tokens: 4, temperature: 1, top_k: 5, top_p: 0.9, min_p: 0.05, repetition_penalty: 1.2 })
          ).json();
          kinds.ok++;
      }
    };
    const worker = async () => {
      while (next < 200) await one(next++);
    };
    await Promise.all(Array.from({ length: 8 }, worker));
    expect(kinds.ok + kinds.bad + kinds.cancelled).toBe(200);
    await idle();
    const after = await health();
    expect(after.active_requests).toBe(0);
    expect(after.memory.active_bytes).toBe(baseline);
  });
});
