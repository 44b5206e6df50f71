// Soak test of `mlx-bun serve`, loopback only, bounded in count and time: a stream of mixed
// requests (chat and completions, streamed and not, n > 1, logprobs, clients that hang up, bad
// requests), then clients that stop reading their streams. Reports requests, errors (5xx, network
// errors, hung requests), latency p50/p99, and the server's RSS and MLX memory before and after.
//
//   .native/bin/bun tools/bench/soak.ts [--model DIR] [--requests N] [--concurrency C]
//       [--stalled K] [--stalled-n N] [--stalled-only] [--kinds 0,1,…] [--max-tokens N]
//       [--server-args "…"] [--cli PATH] [--trace] [--json]
//
// Without --model it makes the tiny checkpoint. --cli runs another checkout's cli.ts (to compare
// with the code before a change). The server runs as its own process, so RSS is the server's.
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { runPython } from "../oracle/oracle.ts";
import { freePort } from "../oracle/ports.ts";

const ROOT = resolve(import.meta.dirname, "..", "..");

function arg(name: string, def: string): string {
  const i = process.argv.indexOf(name);
  return i >= 0 && process.argv[i + 1] !== undefined ? process.argv[i + 1]! : def;
}
const REQUESTS = Math.min(50_000, Number(arg("--requests", "2000")));
const CONCURRENCY = Math.min(64, Number(arg("--concurrency", "8")));
const STALLED = Math.min(64, Number(arg("--stalled", "16")));
const MAX_TOKENS = Number(arg("--max-tokens", "16"));
const CLI = resolve(arg("--cli", join(ROOT, "apps", "mlx-bun", "src", "cli.ts")));
const JSON_OUT = process.argv.includes("--json");
/** Choices per stalled request (more output than the socket buffers hold). */
const STALLED_N = Math.min(16, Number(arg("--stalled-n", "4")));
/** Skip phase 1 (only the stalled readers). */
const SOAK = !process.argv.includes("--stalled-only");
const TRACE = process.argv.includes("--trace");
/** The request kinds of phase 1 (0..9, see `one`), e.g. "0,1,2,3" to compare with code that fails the others. */
const KINDS = arg("--kinds", "0,1,2,3,4,5,6,7,8,9").split(",").map(Number);
/** Hard bound on the whole run. */
const DEADLINE = performance.now() + Number(arg("--max-seconds", "1800")) * 1000;

function rssBytes(pid: number): number {
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
    if (m) return Number(m[1]) * 1024;
  } catch {
    // not Linux: ps
  }
  const p = Bun.spawnSync(["ps", "-o", "rss=", "-p", String(pid)]);
  return Number(p.stdout.toString().trim()) * 1024;
}

const MB = (b: number) => `${(b / 1024 / 1024).toFixed(0)} MB`;

async function main() {
  let tmp: string | null = null;
  let model = arg("--model", "");
  if (!model) {
    tmp = mkdtempSync(join(tmpdir(), "mlxb-soak-"));
    model = join(tmp, "tiny");
    runPython([join(ROOT, "tools", "make-tiny-model", "make_tiny_model.py"), "--variant", "small", "--out", model]);
  }
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  // --server-args "…": extra serve flags (e.g. "--write-timeout 10 --max-buffered-output 1M").
  const extra = arg("--server-args", "")
    .split(" ")
    .filter((x) => x.length > 0);
  const proc = Bun.spawn([process.execPath, CLI, "serve", "--model", model, "--host", "127.0.0.1", "--port", String(port), "--no-log", "--no-web", ...extra], {
    stdout: "ignore",
    stderr: "pipe",
  });
  const stderr = new Response(proc.stderr).text();
  try {
    const t0 = performance.now();
    for (;;) {
      if (proc.exitCode !== null) throw new Error(`the server exited with ${proc.exitCode}: ${await stderr}`);
      try {
        if ((await fetch(`${url}/health`)).ok) break;
      } catch {
        // not listening yet
      }
      if (performance.now() - t0 > 180_000) throw new Error("the server did not start in 180 s");
      await Bun.sleep(200);
    }
    const health = async () =>
      (await (await fetch(`${url}/health`)).json()) as { active_requests: number; memory: { active_bytes: number; cache_bytes: number } };
    const waitIdle = async (ms: number) => {
      const t = performance.now();
      while (performance.now() - t < ms && (await health()).active_requests > 0) await Bun.sleep(50);
      return (await health()).active_requests;
    };
    const post = (path: string, body: unknown, signal?: AbortSignal) =>
      fetch(`${url}${path}`, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: typeof body === "string" ? body : JSON.stringify(body),
        signal: signal ?? AbortSignal.timeout(120_000),
      });
    const prompts = ["Tell me a story", "What is 2+2?", "Write a haiku about the sea", "List three colors", "hello"];
    const messages = (i: number) => [{ role: "user", content: `${prompts[i % prompts.length]} (${i})` }];

    // Warm up (weights are loaded lazily), then the baseline.
    for (let i = 0; i < 4; i++) await (await post("/v1/chat/completions", { messages: messages(i), max_tokens: MAX_TOKENS })).text();
    await waitIdle(30_000);
    const before = { rss: rssBytes(proc.pid), mlx: (await health()).memory.active_bytes };

    // ---- phase 1: mixed requests -------------------------------------------------------------
    const lat: number[] = [];
    const errors = { server5xx: 0, unexpected: 0, network: 0, hung: 0 };
    /** The first few faults, to see what they were. */
    const samples: string[] = [];
    const statuses = new Map<number, number>();
    let next = 0;
    const one = async (i: number) => {
      const kind = KINDS[i % KINDS.length]!;
      const t = performance.now();
      let expect = 200;
      try {
        let res: Response;
        switch (kind) {
          case 0:
            res = await post("/v1/chat/completions", { messages: messages(i), max_tokens: MAX_TOKENS });
            break;
          case 1:
            res = await post("/v1/chat/completions", { messages: messages(i), max_tokens: MAX_TOKENS, stream: true, stream_options: { include_usage: true } });
            break;
          case 2:
            res = await post("/v1/completions", { prompt: prompts[i % prompts.length], max_tokens: MAX_TOKENS, logprobs: 3 });
            break;
          case 3:
            res = await post("/v1/completions", { prompt: prompts[i % prompts.length], max_tokens: MAX_TOKENS, stream: true, temperature: 0.8, seed: i });
            break;
          case 4:
            res = await post("/v1/chat/completions", {
              messages: messages(i),
              max_tokens: MAX_TOKENS,
              n: 2,
              temperature: 0.7,
              top_p: 0,
              repetition_penalty: 1.1,
              repetition_context_size: 0,
            });
            break;
          case 5: {
            // A client that hangs up after the first chunk.
            const ac = new AbortController();
            res = await post("/v1/chat/completions", { messages: messages(i), max_tokens: MAX_TOKENS * 4, stream: true }, ac.signal);
            const reader = res.body!.getReader();
            await reader.read();
            ac.abort();
            await reader.read().catch(() => {});
            statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1);
            lat.push(performance.now() - t);
            return;
          }
          case 6:
            expect = 400;
            res = await post("/v1/chat/completions", { messages: messages(i), max_tokens: 0 });
            break;
          case 7:
            expect = 400;
            res = await post("/v1/chat/completions", '{"messages": [');
            break;
          case 8:
            expect = 400;
            res = await post("/v1/completions", { prompt: "x", seed: -1, temperature: 1 });
            break;
          default:
            res = await post("/v1/chat/completions", { messages: messages(i), max_tokens: MAX_TOKENS, temperature: 1, top_k: 5, min_p: 0.05, stop: ["\n\n"] });
        }
        const text = await res.text();
        statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1);
        if (res.status >= 500 || text.includes("server_error")) {
          errors.server5xx++;
          if (samples.length < 5) samples.push(`kind ${kind}: ${res.status} ${text.slice(0, 300)}`);
        } else if (res.status !== expect) {
          errors.unexpected++;
          if (samples.length < 5) samples.push(`kind ${kind}: ${res.status} (expected ${expect}) ${text.slice(0, 300)}`);
        }
        lat.push(performance.now() - t);
      } catch (e) {
        if ((e as Error).name === "TimeoutError") errors.hung++;
        else errors.network++;
      }
    };
    const t1 = performance.now();
    await Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        for (let i = next++; SOAK && i < REQUESTS && performance.now() < DEADLINE; i = next++) await one(i);
      }),
    );
    const soakSeconds = (performance.now() - t1) / 1000;
    const activeAfterSoak = await waitIdle(60_000);
    const afterSoak = { rss: rssBytes(proc.pid), mlx: (await health()).memory.active_bytes };
    lat.sort((a, b) => a - b);
    const q = (p: number) => lat[Math.min(lat.length - 1, Math.floor(p * lat.length))] ?? 0;

    // ---- phase 2: clients that stop reading ---------------------------------------------------
    const eos = { "1": -100, "6": -100, "14": -100 };
    // Four choices with 20 alternatives per token: more output than the socket buffers hold.
    const body = JSON.stringify({
      prompt: "Tell me a long story",
      max_tokens: 100_000,
      n: STALLED_N,
      stream: true,
      top_logprobs: 20,
      temperature: 1,
      seed: 1,
      logit_bias: eos,
    });
    const req = `POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`;
    const socks: { closedAt: number | null; sock: net.Socket }[] = [];
    const t2 = performance.now();
    for (let i = 0; i < STALLED; i++) {
      const entry = { closedAt: null as number | null, sock: net.connect({ port, host: "127.0.0.1" }, () => entry.sock.write(req)) };
      entry.sock.pause();
      entry.sock.on("error", () => {});
      entry.sock.on("close", () => {
        entry.closedAt = performance.now() - t2;
      });
      socks.push(entry);
    }
    let peakRss = rssBytes(proc.pid);
    let peakActive = 0;
    // Until every stalled request has ended and its connection is closed (bounded: 120 s).
    while (performance.now() - t2 < 120_000) {
      await Bun.sleep(250);
      peakRss = Math.max(peakRss, rssBytes(proc.pid));
      const h = await health();
      peakActive = Math.max(peakActive, h.active_requests);
      if (TRACE)
        console.log(
          `  t=${((performance.now() - t2) / 1000).toFixed(1)}s rss=${MB(rssBytes(proc.pid))} mlx active=${MB(h.memory.active_bytes)} cache=${MB(h.memory.cache_bytes)} requests=${h.active_requests} open=${socks.filter((x) => x.closedAt === null).length}`,
        );
      if (h.active_requests === 0 && socks.every((s) => s.closedAt !== null)) break;
    }
    const stalledOpen = socks.filter((s) => s.closedAt === null).length;
    for (const s of socks) s.sock.destroy();
    const activeAfterStall = await waitIdle(30_000);
    await Bun.sleep(500);
    const after = { rss: rssBytes(proc.pid), mlx: (await health()).memory.active_bytes };

    const report = {
      model,
      requests: lat.length,
      seconds: Number(soakSeconds.toFixed(1)),
      statuses: Object.fromEntries([...statuses.entries()].sort()),
      errors,
      error_samples: samples,
      latency_ms: { p50: Math.round(q(0.5)), p99: Math.round(q(0.99)) },
      active_after_soak: activeAfterSoak,
      memory: {
        before: { rss: before.rss, mlx_active: before.mlx },
        after_soak: { rss: afterSoak.rss, mlx_active: afterSoak.mlx },
        stalled_peak_rss: peakRss,
        after: { rss: after.rss, mlx_active: after.mlx },
      },
      stalled: {
        clients: STALLED,
        peak_active: peakActive,
        still_open: stalledOpen,
        closed_within_s: Number((Math.max(0, ...socks.map((s) => s.closedAt ?? 0)) / 1000).toFixed(1)),
        active_after: activeAfterStall,
      },
    };
    if (JSON_OUT) console.log(JSON.stringify(report));
    else {
      console.log(`soak: ${report.requests} requests in ${report.seconds} s (concurrency ${CONCURRENCY}), statuses ${JSON.stringify(report.statuses)}`);
      console.log(`errors: 5xx ${errors.server5xx}, unexpected status ${errors.unexpected}, network ${errors.network}, hung ${errors.hung}`);
      for (const x of samples) console.log(`  ${x}`);
      console.log(`latency: p50 ${report.latency_ms.p50} ms, p99 ${report.latency_ms.p99} ms`);
      console.log(`memory: RSS ${MB(before.rss)} -> ${MB(afterSoak.rss)} after the soak; MLX active ${MB(before.mlx)} -> ${MB(afterSoak.mlx)}`);
      console.log(
        `stalled readers: ${STALLED} (peak ${peakActive} active), peak RSS ${MB(peakRss)}, ${stalledOpen} still open, all closed within ${report.stalled.closed_within_s} s; after: RSS ${MB(after.rss)}, MLX active ${MB(after.mlx)}, ${activeAfterStall} active`,
      );
    }
    return report;
  } finally {
    proc.kill("SIGTERM");
    await Promise.race([proc.exited, Bun.sleep(10_000)]);
    if (proc.exitCode === null) proc.kill("SIGKILL");
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  }
}

await main();
