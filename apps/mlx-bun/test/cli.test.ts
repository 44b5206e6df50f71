// The CLI as a user runs it: generate (--json, stdin, a repo id through a fake hub), chat with
// history over piped input, serve as a process, argument errors and the missing-model hint.
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { startFakeHub, type FakeHub } from "./fake-hub.ts";
import { BUN, CLI, makeTinySmall, ROOT, runCli, tempDir } from "./helpers.ts";

let tmp: ReturnType<typeof tempDir>;
let dir: string;
let hub: FakeHub;

beforeAll(() => {
  // The tests talk to a local fake hub only; an offline setting of the environment must not apply.
  delete process.env.HF_HUB_OFFLINE;
  tmp = tempDir("mlxb-cli-");
  dir = makeTinySmall(join(tmp.path, "tiny"));
  hub = startFakeHub({ repos: { "tiny-org/tiny": dir } });
});

afterAll(async () => {
  await hub?.stop();
  tmp?.cleanup();
});

const json = (stdout: string) => {
  const lines = stdout.trim().split("\n");
  expect(lines).toHaveLength(1);
  return JSON.parse(lines[0]!);
};

describe("generate", () => {
  test("--json prints one line; a repo id from the hub gives the same result as the directory", async () => {
    const local = await runCli(["generate", "--json", "--model", dir, "--prompt", "hello", "--max-tokens", "8"]);
    expect(local.code, local.stderr).toBe(0);
    const a = json(local.stdout);
    expect(Object.keys(a)).toEqual(expect.arrayContaining(["prompt", "prompt_ids", "generated_ids", "text", "timings"]));
    expect(a.prompt).toBe("hello");
    expect(a.generated_ids).toHaveLength(8);
    expect(a.timings.generation_tps).toBeGreaterThan(0);

    const fromHub = await runCli(["generate", "--json", "--model", "tiny-org/tiny", "--prompt", "hello", "--max-tokens", "8"], {
      env: { MLX_BUN_HF_ENDPOINT: hub.url, MLX_BUN_CACHE: join(tmp.path, "cache") },
    });
    expect(fromHub.code, fromHub.stderr).toBe(0);
    const b = json(fromHub.stdout);
    expect(b.generated_ids).toEqual(a.generated_ids);
    expect(b.model).toBe("tiny-org/tiny");
  });

  test("--prompt - reads stdin; --ignore-chat-template uses the raw prompt with <bos>", async () => {
    const r = await runCli(["generate", "--json", "--model", dir, "--prompt", "-", "--ignore-chat-template", "--max-tokens", "3"], { stdin: "from stdin" });
    expect(r.code, r.stderr).toBe(0);
    const o = json(r.stdout);
    expect(o.prompt).toBe("from stdin");
    expect(o.prompt_ids[0]).toBe(2);
    expect(o.prompt_ids.length).toBeLessThan(15);
  });

  test("--kv turbo:4,3: TurboQuant on the full-attention layers (head dim 64), the sliding layers (head dim 32, which TurboQuant cannot hold) bf16 unless --kv-sliding quantizes them", async () => {
    const full = await runCli(["generate", "--json", "--model", dir, "--prompt", "hi", "--max-tokens", "4", "--kv", "turbo:4,3"]);
    expect(full.code, full.stderr).toBe(0);
    expect(json(full.stdout).generated_ids).toHaveLength(4);
    const all = await runCli(["generate", "--model", dir, "--prompt", "hi", "--max-tokens", "4", "--kv", "turbo:4,3", "--kv-sliding", "turbo:4,3"]);
    expect(all.code).toBe(1);
    expect(all.stderr).toMatch(/--kv turbo:4,3 cannot hold this model's sliding-attention layers \(head dim 32\)/);
  });

  test("bad arguments exit 1 with a message", async () => {
    for (const args of [
      ["generate", "--temp", "hot"],
      ["generate", "--max-tokens", "0"],
      ["generate", "--kv", "q5"],
      ["generate", "--kv-sliding", "q3"],
      ["serve", "--port", "x"],
      ["generate", "--model", "./no/such/dir"],
    ]) {
      const r = await runCli(args);
      expect(r.code, args.join(" ")).toBe(1);
      expect(r.stderr, args.join(" ")).toMatch(
        /--temp must be a number|--max-tokens must be at least 1|--kv must be|--kv-sliding must be bf16, q8, q4 or turbo:<kbits>,<vbits>, got "q3"|--port must be an integer|no such directory/,
      );
    }
  });

  test("without --model and without the bundled model, a hint names tools/setup.sh", async () => {
    const r = await runCli(["generate", "--prompt", "x"], { env: { MLX_BUN_TINY_MODEL_DIR: join(tmp.path, "missing") } });
    expect(r.code).toBe(1);
    expect(r.stderr).toContain("bundled tiny model is missing");
    expect(r.stderr).toContain("tools/setup.sh");
  });
});

describe("chat", () => {
  test("keeps the history across turns; /reset clears it; /exit quits", async () => {
    const r = await runCli(["chat", "--model", dir, "--max-tokens", "6", "--verbose"], {
      stdin: "hello there\nand again\n/reset\nhello there\n/exit\nnot read\n",
    });
    expect(r.code, r.stderr).toBe(0);
    const turns = [...r.stderr.matchAll(/\[prompt (\d+) tokens .*?generated (\d+) tokens/g)].map((m) => [Number(m[1]), Number(m[2])]);
    expect(turns).toHaveLength(3);
    // The second prompt holds the first turn (its prompt, its 6-token answer) and the new message.
    expect(turns[1]![0]).toBeGreaterThan(turns[0]![0]! + turns[0]![1]!);
    // After /reset the same message is a fresh one-turn prompt again.
    expect(turns[2]![0]).toBe(turns[0]![0]);
    expect(r.stdout).toContain("[history cleared]");
  });
});

describe("serve", () => {
  test("listens (--port 0), answers, and stops on SIGINT", async () => {
    const p = Bun.spawn([BUN, CLI, "serve", "--model", dir, "--port", "0", "--max-tokens", "4"], { cwd: ROOT, stdout: "pipe", stderr: "pipe" });
    try {
      const reader = p.stderr.getReader();
      let err = "";
      let url: string | undefined;
      const deadline = Date.now() + 30_000;
      while (!url && Date.now() < deadline) {
        const { value, done } = await reader.read();
        if (done) break;
        err += new TextDecoder().decode(value);
        url = /listening on (http:\/\/\S+).*\n/.exec(err)?.[1]; // the whole line
      }
      expect(url, err).toBeDefined();
      const h = (await (await fetch(`${url}/health`)).json()) as { status: string; kv_mode: string };
      expect(h.status).toBe("ok");
      expect(h.kv_mode).toBe("bf16");
      expect(err).toContain(`(web chat at ${url}/)`);
      const page = await fetch(`${url}/`); // the web chat that tools/setup.sh built (test/web.test.ts drives it)
      expect(page.status).toBe(200);
      expect(await page.text()).toContain("<title>mlx-bun chat</title>");
      const r = await fetch(`${url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ prompt: "hi" }),
      });
      const body = (await r.json()) as { usage: { completion_tokens: number } };
      expect(body.usage.completion_tokens).toBe(4); // --max-tokens is the default
      // The prompt cache is on by default (as mlx_lm.server): the same prompt again reuses it.
      const again = await fetch(`${url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ prompt: "hi" }),
      });
      const usage = ((await again.json()) as { usage: { prompt_tokens: number; prompt_tokens_details: { cached_tokens: number } } }).usage;
      expect(usage.prompt_tokens_details.cached_tokens).toBe(usage.prompt_tokens - 1);
      reader.releaseLock();
      p.kill("SIGINT");
      expect(await p.exited).toBe(0);
    } finally {
      if (p.exitCode === null) p.kill();
    }
  });
});
