import { Engine, PromptCache, Scheduler } from "@mlx-bun/runtime";
import { startServer } from "../src/server/http.ts";
const engine = Engine.load("/tmp/rb/tiny");
const promptCache = new PromptCache({ maxEntries: 10, maxBytes: 1 << 30 });
const scheduler = new Scheduler(engine, { maxBatch: 32, prefillBatch: 8, promptCache });
const srv = startServer({ model: engine.loaded, scheduler, modelId: "m", port: 0, webDir: null });
const url = srv.url;
const kinds = (process.argv[2] ?? "0,4").split(",").map(Number);
const post = (path: string, body: unknown, signal?: AbortSignal) => fetch(`${url}${path}`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body), signal });
const prompts = ["Tell me a story", "What is 2+2?", "Write a haiku about the sea", "List three colors", "hello"];
const messages = (i: number) => [{ role: "user", content: `${prompts[i % prompts.length]} (${i})` }];
const M = 16; let bad = 0; const msgs = new Set<string>();
const one = async (i: number) => {
  const kind = kinds[i % kinds.length]!;
  let res: Response;
  switch (kind) {
    case 0: res = await post("/v1/chat/completions", { messages: messages(i), max_tokens: M }); break;
    case 1: res = await post("/v1/chat/completions", { messages: messages(i), max_tokens: M, stream: true, stream_options: { include_usage: true } }); break;
    case 2: res = await post("/v1/completions", { prompt: prompts[i % prompts.length], max_tokens: M, logprobs: 3 }); break;
    case 3: res = await post("/v1/completions", { prompt: prompts[i % prompts.length], max_tokens: M, stream: true, temperature: 0.8, seed: i }); break;
    case 4: res = await post("/v1/chat/completions", { messages: messages(i), max_tokens: M, n: 2, temperature: 0.7, top_p: 0, repetition_penalty: 1.1, repetition_context_size: 0 }); break;
    case 5: { const ac = new AbortController(); res = await post("/v1/chat/completions", { messages: messages(i), max_tokens: M * 4, stream: true }, ac.signal); const rd = res.body!.getReader(); await rd.read(); ac.abort(); await rd.read().catch(() => {}); return; }
    default: res = await post("/v1/chat/completions", { messages: messages(i), max_tokens: M, temperature: 1, top_k: 5, min_p: 0.05, stop: ["\n\n"] });
  }
  const t = await res.text();
  if (res.status >= 500 || t.includes("server_error")) { bad++; msgs.add(`kind ${kind}: ${t.slice(0, 160)}`); }
};
let next = 0;
await Promise.all(Array.from({ length: 8 }, async () => { for (let i = next++; i < 300; i = next++) await one(i); }));
console.log(process.argv[2], "bad", bad, [...msgs].slice(0, 3));
process.exit(0);
