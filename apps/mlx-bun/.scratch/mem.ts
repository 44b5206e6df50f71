import { memory } from "@mlx-bun/mlx-ffi";
import { Engine, Scheduler } from "@mlx-bun/runtime";
import { startServer } from "../src/server/http.ts";
const engine = Engine.load("/tmp/rb/tiny");
const scheduler = new Scheduler(engine, { maxBatch: 16 });
const srv = startServer({ model: engine.loaded, scheduler, modelId: "m", port: 0, webDir: null });
const post = async (path: string, b: unknown) => { const r = await fetch(srv.url + path, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(b) }); return [r.status, (await r.text()).slice(0, 100)]; };
const chat = (x: object) => ({ messages: [{ role: "user", content: "hi" }], max_tokens: 2, ...x });
const kinds: [string, () => Promise<unknown>][] = [
  ["plain", () => post("/v1/chat/completions", chat({}))],
  ["stream", () => post("/v1/chat/completions", chat({ stream: true }))],
  ["json_object", () => post("/v1/chat/completions", chat({ response_format: { type: "json_object" } }))],
  ["json_schema", () => post("/v1/chat/completions", chat({ response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "object" } } } }))],
  ["logit_bias", () => post("/v1/chat/completions", chat({ logit_bias: { "5": 100 } }))],
  ["xtc", () => post("/v1/chat/completions", chat({ temperature: 1, xtc_probability: 0.5 }))],
  ["pen", () => post("/v1/chat/completions", chat({ repetition_penalty: 1.5, presence_penalty: 1 }))],
  ["n4 seed", () => post("/v1/chat/completions", chat({ n: 4, temperature: 1, seed: 3 }))],
  ["logprobs", () => post("/v1/completions", { prompt: "hi", max_tokens: 2, logprobs: 5 })],
  ["messages", () => post("/v1/messages", { model: "m", max_tokens: 2, messages: [{ role: "user", content: "hi" }] })],
  ["responses", () => post("/v1/responses", { model: "m", max_output_tokens: 2, input: "hi" })],
  ["bad400", () => post("/v1/chat/completions", chat({ seed: -1, temperature: 1 }))],
];
for (const [name, f] of kinds) {
  await f(); await Bun.sleep(50); memory.clearCache();
  const a = memory.active();
  for (let i = 0; i < 3; i++) console.log(name, JSON.stringify(await f()).slice(0, 120));
  await Bun.sleep(100); memory.clearCache();
  console.log(name, "delta", memory.active() - a, "active", memory.active());
}
process.exit(0);
