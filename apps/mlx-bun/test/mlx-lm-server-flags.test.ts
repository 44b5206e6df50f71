// mlx_lm.server's flags: both servers started with the same command line (every flag at once,
// plus a --draft-model pair) on a tiny checkpoint, the same requests, the same replies; and our
// --prompt-cache-file / --prompt-cache-dir (persist the prompt cache at shutdown, restore it at
// start, as llama.cpp's slot save/restore).
import { copyFileSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { oraclePython, runPython } from "../../../tools/oracle/oracle.ts";
import { freePort } from "../../../tools/oracle/ports.ts";
import { BUN, CLI, makeTinySmall, MAKER, ROOT, runCli, tempDir } from "./helpers.ts";

let tmp: ReturnType<typeof tempDir>;
let small = "";
let dense = "";
let adapter = "";

beforeAll(() => {
  tmp = tempDir("mlxb-srvflags-");
  small = makeTinySmall(join(tmp.path, "small"));
  dense = join(tmp.path, "dense");
  runPython([MAKER, "--variant", "dense", "--out", dense]);
  adapter = join(tmp.path, "adapter");
  runPython([join(ROOT, "tools", "oracle", "lora_oracle.py"), small, adapter, join(tmp.path, "lora-ref.safetensors"), "--ids", "2,5,6"]);
}, 120_000);
afterAll(() => tmp?.cleanup());

interface Server {
  url: string;
  proc: ReturnType<typeof Bun.spawn>;
  stderr: () => string;
  stop(signal?: NodeJS.Signals): Promise<number>;
}

/** Start `mlx_lm.server` or `mlx-bun serve` with `args` (plus --host/--port), ready to answer. */
async function start(side: "mlx_lm" | "mlx-bun", args: string[]): Promise<Server> {
  const port = await freePort();
  const all = [...args, "--host", "127.0.0.1", "--port", String(port)];
  const cmd = side === "mlx-bun" ? [BUN, CLI, "serve", ...all] : [oraclePython(), "-m", "mlx_lm", "server", ...all];
  const proc = Bun.spawn(cmd, { cwd: ROOT, stdout: "ignore", stderr: "pipe", env: { ...process.env, PYTHONUNBUFFERED: "1" } });
  let err = "";
  void (async () => {
    const dec = new TextDecoder();
    for await (const chunk of proc.stderr as ReadableStream<Uint8Array>) err += dec.decode(chunk);
  })();
  const url = `http://127.0.0.1:${port}`;
  const t0 = performance.now();
  for (;;) {
    if (proc.exitCode !== null) throw new Error(`${side} exited with ${proc.exitCode}: ${err}`);
    try {
      if ((await fetch(`${url}/v1/models`)).ok) break;
    } catch {
      // not listening yet
    }
    if (performance.now() - t0 > 60_000) throw new Error(`${side} did not start: ${err}`);
    await Bun.sleep(100);
  }
  return {
    url,
    proc,
    stderr: () => err,
    stop: async (signal = "SIGTERM") => {
      proc.kill(signal);
      await Promise.race([proc.exited, Bun.sleep(15_000)]);
      if (proc.exitCode === null) proc.kill("SIGKILL");
      return proc.exited;
    },
  };
}

async function post(url: string, path: string, body: unknown, headers: Record<string, string> = {}) {
  const r = await fetch(`${url}${path}`, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(body) });
  const text = await r.text();
  if (!r.ok) throw new Error(`${url}${path}: ${r.status} ${text}`);
  return { json: JSON.parse(text), headers: r.headers };
}

const TEMPLATE =
  "{{ bos_token }}{% for m in messages %}<|turn>{{ m['role'] }}\n{{ m['content'] }}<turn|>\n{% endfor %}{% if add_generation_prompt %}<|turn>model\n{% endif %}";

/** The same requests on both servers: a chat turn (with an Origin) and a completion. */
async function exchange(s: Server, origin?: string) {
  const chat = await post(s.url, "/v1/chat/completions", { messages: [{ role: "user", content: "hello there" }] }, origin ? { Origin: origin } : {});
  const comp = await post(s.url, "/v1/completions", { prompt: "The sea and the wind" });
  return {
    chat: chat.json.choices[0].message.content as string | null,
    chatUsage: [chat.json.usage.prompt_tokens, chat.json.usage.completion_tokens],
    origin: chat.headers.get("access-control-allow-origin"),
    completion: comp.json.choices[0].text as string,
    completionUsage: [comp.json.usage.prompt_tokens, comp.json.usage.completion_tokens],
  };
}

describe("mlx_lm.server's flags: same command line, same replies", () => {
  test("every flag at once (adapter, chat template and its args, sampling defaults, concurrency, prompt cache, KV bits, log level, CORS, pipeline, trust-remote-code)", async () => {
    const args = [
      "--model",
      small,
      "--adapter-path",
      adapter,
      "--allowed-origins",
      "http://a.test,http://b.test",
      "--trust-remote-code",
      "--log-level",
      "WARNING",
      "--chat-template",
      TEMPLATE,
      "--use-default-chat-template",
      "--temp",
      "0",
      "--top-p",
      "1",
      "--top-k",
      "0",
      "--min-p",
      "0",
      "--max-tokens",
      "7",
      "--chat-template-args",
      '{"enable_thinking": false}',
      "--decode-concurrency",
      "4",
      "--prompt-concurrency",
      "2",
      "--prefill-step-size",
      "16",
      "--prompt-cache-size",
      "5",
      "--prompt-cache-bytes",
      "100M",
      "--kv-bits",
      "8",
      "--kv-group-size",
      "64",
      "--quantized-kv-start",
      "5000",
      "--num-draft-tokens",
      "3",
      "--pipeline",
    ];
    const theirs = await start("mlx_lm", args);
    let a;
    try {
      a = await exchange(theirs, "http://b.test");
    } finally {
      await theirs.stop();
    }
    const mine = await start("mlx-bun", args);
    let b;
    try {
      b = await exchange(mine, "http://b.test");
      expect(mine.stderr()).not.toMatch(/POST \/v1/); // --log-level WARNING: no request lines
    } finally {
      expect(await mine.stop()).toBe(0);
    }
    expect(b).toEqual(a);
    expect(a.origin).toBe("http://b.test");
    expect(a.chatUsage[1]).toBe(7); // --max-tokens is the default
    // The template given is used: "hello there" in it is shorter than in the model's own template.
    const own = await runCli(["generate", "--model", small, "--prompt", "hello there", "--json", "-m", "1"]);
    expect(a.chatUsage[0]).toBeLessThan((JSON.parse(own.stdout) as { prompt_ids: number[] }).prompt_ids.length);
  }, 180_000);

  test("--draft-model, --num-draft-tokens: the greedy replies of mlx_lm.server without the draft (with it, mlx_lm.server fails on Gemma 4)", async () => {
    const args = ["--model", small, "--draft-model", small, "--num-draft-tokens", "2", "--max-tokens", "9"];
    const failing = await start("mlx_lm", args);
    try {
      await expect(exchange(failing)).rejects.toThrow();
      await Bun.sleep(200);
      expect(failing.stderr()).toMatch(/broadcast_shapes/);
    } finally {
      await failing.stop();
    }
    const theirs = await start("mlx_lm", ["--model", small, "--max-tokens", "9"]);
    let a;
    try {
      a = await exchange(theirs);
    } finally {
      await theirs.stop();
    }
    const mine = await start("mlx-bun", args);
    try {
      // (CORS aside: without --allowed-origins mlx_lm.server answers "*", ours none: docs/server.md.)
      expect({ ...(await exchange(mine)), origin: a.origin }).toEqual(a);
    } finally {
      await mine.stop();
    }
  }, 180_000);

  test("--kv-bits with a start inside the prompt: ours equals mlx_lm.generate with the full-attention caches quantized (mlx_lm.server fails there on Gemma 4)", async () => {
    const cases = join(tmp.path, "kvbits.json");
    writeFileSync(
      cases,
      JSON.stringify([
        {
          command: "generate",
          argv: ["--model", dense, "--prompt", "The sea and the wind", "--ignore-chat-template", "-m", "12", "--kv-bits", "8", "--quantized-kv-start", "4"],
          quantize_full_only: true,
        },
      ]),
    );
    const ref = JSON.parse(runPython([join(ROOT, "apps", "mlx-bun", "test", "mlx_lm_cli.py"), cases]))[0] as { error: string | null; runs: { text: string }[] };
    expect(ref.error).toBeNull();
    const mine = await start("mlx-bun", ["--model", dense, "--kv-bits", "8", "--quantized-kv-start", "4", "--max-tokens", "12", "--decode-concurrency", "8"]);
    try {
      const r = await post(mine.url, "/v1/completions", { prompt: "The sea and the wind" });
      expect(r.json.choices[0].text).toBe(ref.runs[0]!.text);
      expect(mine.stderr()).toMatch(/--kv-bits: requests are served one at a time \(as mlx_lm\.server\)/);
      const h = (await (await fetch(`${mine.url}/health`)).json()) as { kv_mode: string };
      expect(h.kv_mode).toBe("bf16, q8 (group 64) from token 4 on full-attention layers");
    } finally {
      await mine.stop();
    }
  }, 120_000);

  test("bad values are clear errors", async () => {
    for (const [args, re] of [
      [["--log-level", "LOUD"], /--log-level must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL/],
      [["--prompt-cache-bytes", "12TB"], /--prompt-cache-bytes must be a size like/],
      [["--decode-concurrency", "0"], /--decode-concurrency must be at least 1/],
      [["--kv", "q8", "--kv-bits", "4"], /--kv-bits quantizes a bf16 cache .* does not combine with --kv q8/],
      [["--max-batch", "2", "--decode-concurrency", "3"], /--max-batch 2 and --decode-concurrency 3 are the same setting/],
      [["--prompt-cache-size", "0", "--prompt-cache-dir", tmp.path], /--prompt-cache-dir needs the prompt cache/],
    ] as const) {
      const r = await runCli(["serve", "--model", small, "--port", "0", ...args]);
      expect(r.code, args.join(" ")).toBe(1);
      expect(r.stderr, args.join(" ")).toMatch(re);
    }
  }, 60_000);
});

describe("serve --prompt-cache-file and --prompt-cache-dir", () => {
  test("--prompt-cache-file: a request continuing the cached prompt reuses it and gets mlx_lm.generate's tokens", async () => {
    const file = join(tmp.path, "doc.safetensors");
    const doc = "A long document about the sea, the wind and the stones of the north, to be cached once";
    const made = await runCli(["cache-prompt", "--model", small, "--prompt", doc, "--prompt-cache-file", file]);
    expect(made.code, made.stderr).toBe(0);
    const { readPromptCacheInfo, loadPromptCache } = await import("@mlx-bun/runtime");
    const info = readPromptCacheInfo(file);
    void loadPromptCache;
    // mlx_lm.generate on the same file, raw prompt (so the ids are the file's, <bos>, the text).
    const cases = join(tmp.path, "file.json");
    writeFileSync(
      cases,
      JSON.stringify([{ command: "generate", argv: ["--prompt-cache-file", file, "--prompt", "and then", "--ignore-chat-template", "-m", "8"] }]),
    );
    const ref = JSON.parse(runPython([join(ROOT, "apps", "mlx-bun", "test", "mlx_lm_cli.py"), cases]))[0] as {
      error: string | null;
      runs: { prompt: number[]; text: string }[];
    };
    expect(ref.error).toBeNull();
    const { Gemma4Tokenizer } = await import("@mlx-bun/models");
    const { mapSafetensors } = await import("@mlx-bun/mlx-ffi");
    using m = mapSafetensors(file, { padPrefix: `${info.layers.length}.pad.` });
    const cached = m.tensors.get(`${info.layers.length}.tokens`)!.tolist() as number[];
    const ids = [...cached, ...Gemma4Tokenizer.load(small).encode("and then", { addSpecialTokens: true })];
    expect(ids.slice(cached.length)).toEqual(ref.runs[0]!.prompt);
    const s = await start("mlx-bun", ["--model", small, "--prompt-cache-file", file, "--max-tokens", "8"]);
    try {
      const r = await post(s.url, "/v1/completions", { prompt: ids });
      expect(r.json.usage.prompt_tokens_details.cached_tokens).toBe(info.offset);
      expect(r.json.choices[0].text).toBe(ref.runs[0]!.text);
    } finally {
      await s.stop();
    }
  }, 120_000);

  test("--prompt-cache-dir: saved at SIGTERM, restored at start (the same turn again is served from it); bad files are skipped with their reason", async () => {
    const dir = join(tmp.path, "pcache");
    const messages = [
      { role: "system", content: "You are terse. The sea, the wind and the stones of the north." },
      { role: "user", content: "Tell me about the sea." },
    ];
    const ask = async (url: string) => (await post(url, "/v1/chat/completions", { messages, max_tokens: 6 })).json;
    const first = await start("mlx-bun", ["--model", small, "--prompt-cache-dir", dir]);
    let a;
    try {
      a = await ask(first.url);
      expect(a.usage.prompt_tokens_details.cached_tokens).toBe(0);
    } finally {
      expect(await first.stop("SIGTERM")).toBe(0);
    }
    expect(first.stderr()).toMatch(/saved \d+ prompt-cache entries to /);
    const saved = readdirSync(dir).filter((f) => f.endsWith(".safetensors"));
    expect(saved.length).toBeGreaterThan(0);
    expect(readdirSync(dir).filter((f) => f.endsWith(".tmp"))).toEqual([]);
    // A corrupt entry and one of another model: skipped, named, the server starts anyway.
    writeFileSync(join(dir, "prompt-cache-9000.safetensors"), "not a safetensors file");
    const other = join(tmp.path, "other.safetensors");
    expect((await runCli(["cache-prompt", "--model", dense, "--prompt", "x y z", "--prompt-cache-file", other])).code).toBe(0);
    copyFileSync(other, join(dir, "prompt-cache-9001.safetensors"));
    // A temporary file of a save a kill interrupted (its pid is not alive): removed at start.
    const stale = ".prompt-cache-0042.safetensors.999999999.1700000000000.abc123.tmp";
    writeFileSync(join(dir, stale), "half-written");
    const second = await start("mlx-bun", ["--model", small, "--prompt-cache-dir", dir]);
    try {
      expect(second.stderr()).toMatch(/restored \d+ prompt-cache entries \(\d+ tokens\) from /);
      expect(second.stderr()).toMatch(/skipped .*prompt-cache-9000\.safetensors: kv-store .*not a readable snapshot/);
      expect(second.stderr()).toMatch(/skipped .*prompt-cache-9001\.safetensors: kv-store .*saved from another model/);
      expect(second.stderr()).toMatch(/removed 1 temporary files of interrupted saves/);
      expect(readdirSync(dir)).not.toContain(stale);
      const b = await ask(second.url);
      expect(b.usage.prompt_tokens_details.cached_tokens).toBe(b.usage.prompt_tokens - 1);
      expect(b.choices[0].message).toEqual(a.choices[0].message);
    } finally {
      expect(await second.stop("SIGINT")).toBe(0);
    }
    // Entries no longer cached are gone from the folder; the files we wrote are ours (verify passes).
    const left = readdirSync(dir).filter((f) => f.startsWith("prompt-cache-"));
    expect(left).not.toContain("prompt-cache-9000.safetensors");
    const v = await runCli(["verify", ...left.map((f) => join(dir, f))]);
    expect(v.code, v.stderr).toBe(0);
    expect(v.stdout).toMatch(/OK \(kv-snapshot\)/);
  }, 180_000);
});
