import net from "node:net";
import { Engine, Scheduler } from "@mlx-bun/runtime";
import { startServer } from "../src/server/http.ts";
import { streamGuardStats } from "../src/server/stream-guard.ts";
const engine = Engine.load("/tmp/rb/tiny");
const scheduler = new Scheduler(engine, { maxBatch: 16 });
const srv = startServer({ model: engine.loaded, scheduler, modelId: "m", port: 0, webDir: null, limits: { idleTimeoutS: 2, bodyTimeoutS: 3, writeTimeoutS: 1.5, maxBufferedBytes: 32 * 1024, templateTimeoutMs: 1000 } });
const body = JSON.stringify({ prompt: "tell", max_tokens: 3000, n: Number(process.argv[2] ?? 4), stream: true, top_logprobs: 20, temperature: 1, seed: 3, logit_bias: { "1": -100, "6": -100, "14": -100 } });
const t0 = performance.now();
const s = net.connect({ port: srv.port, host: "127.0.0.1" }, () => s.write(`POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`));
s.pause();
s.on("error", (e) => console.log("client error", e.message));
s.on("close", () => console.log("closed at", ((performance.now() - t0) / 1000).toFixed(1)));
for (let i = 0; i < 20; i++) {
  await Bun.sleep(1000);
  console.log((globalThis as any).__w, (globalThis as any).__ret, (globalThis as any).__q, `t=${i + 1}s active=${scheduler.active} stats=${JSON.stringify(streamGuardStats)} rss=${(process.memoryUsage().rss / 1e6).toFixed(0)}MB`);
}
process.exit(0);
