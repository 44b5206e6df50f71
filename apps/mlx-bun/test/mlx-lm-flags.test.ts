// Drop-in for mlx_lm command lines: every flag of mlx_lm.generate, mlx_lm.chat and mlx_lm.cache_prompt
// runs the same command line through mlx_lm (test/mlx_lm_cli.py: each command's own main(), all
// cases in one Python process) and through mlx-bun, on tiny checkpoints, and compares the tokens
// (the prompt ids and the generated ids) or the printed text. Prompt-cache files go both ways.
// The mlx_lm.server flags are in test/mlx-lm-server-flags.test.ts. docs/server.md lists each flag
// with the test that checks it.
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { Gemma4Tokenizer } from "@mlx-bun/models";
import { runPython, runPythonAsync } from "../../../tools/oracle/oracle.ts";
import { makeTinySmall, MAKER, ROOT, runCli, tempDir } from "./helpers.ts";

type ModelName = "small" | "dense" | "q4" | "w64";

interface Case {
  /** mlx_lm's command (module) and ours. */
  command: "generate" | "chat" | "cache_prompt";
  model: ModelName | null;
  argv: string[];
  stdin?: string;
  /** Python side only: skip mlx_lm's RotatingKVCache quantization (it raises NotImplementedError). */
  quantizeFullOnly?: boolean;
}

interface PyRun {
  prompt: number[];
  tokens: number[];
  text: string;
}
interface PyResult {
  stdout: string;
  error: string | null;
  runs: PyRun[];
}

let tmp: ReturnType<typeof tempDir>;
const models: Record<ModelName, string> = { small: "", dense: "", q4: "", w64: "" };
let adapter = "";
let files: Record<"oursSmall" | "oursDenseQ" | "theirsSmall" | "theirsDenseQ" | "oursW64" | "theirsW64", string>;
const DOC = "Here is a document about the sea, the wind and the stones of the north. It is long enough to wrap the sliding window";

/** Cases by id: the Python side runs them all at once, ours one process each. */
const cases = new Map<string, Case>();
const py = new Map<string, PyResult>();
const ours = new Map<string, { code: number; stdout: string; stderr: string }>();

const gen = (id: string, model: ModelName | null, argv: string[], extra: Partial<Case> = {}): void => {
  cases.set(id, { command: "generate", model, argv, ...extra });
};
const argvOf = (c: Case): string[] => [...(c.model ? ["--model", models[c.model]] : []), ...c.argv];
const oursCommand = (c: Case): string => (c.command === "cache_prompt" ? "cache-prompt" : c.command);

/** Ours, with --json for generate cases compared by tokens. */
async function runOurs(id: string, json: boolean): Promise<void> {
  const c = cases.get(id)!;
  const r = await runCli([oursCommand(c), ...argvOf(c), ...(json ? ["--json"] : [])], {
    ...(c.stdin !== undefined ? { stdin: c.stdin } : {}),
    timeoutMs: 120_000,
  });
  ours.set(id, r);
}

/** A few at a time (the CPU has few cores). */
async function pool(ids: string[], fn: (id: string) => Promise<void>, width = 2): Promise<void> {
  const queue = [...ids];
  await Promise.all(
    Array.from({ length: width }, async () => {
      for (let id = queue.shift(); id !== undefined; id = queue.shift()) await fn(id);
    }),
  );
}

async function runMlxLm(ids: string[]): Promise<void> {
  const spec = ids.map((id) => {
    const c = cases.get(id)!;
    return { command: c.command, argv: argvOf(c), stdin: c.stdin ?? "", quantize_full_only: c.quantizeFullOnly ?? false };
  });
  const f = join(tmp.path, `cases-${py.size}.json`);
  writeFileSync(f, JSON.stringify(spec));
  const out = JSON.parse(await runPythonAsync([join(ROOT, "apps", "mlx-bun", "test", "mlx_lm_cli.py"), f])) as PyResult[];
  ids.forEach((id, i) => py.set(id, out[i]!));
}

// Tokens-compared cases (ours with --json): id → flag(s) under test.
const TOKEN_CASES: string[] = [];
const tokenCase = (id: string, model: ModelName | null, argv: string[], extra: Partial<Case> = {}): void => {
  gen(id, model, argv, extra);
  TOKEN_CASES.push(id);
};

tokenCase("default", "small", ["--prompt", "hello", "-m", "8"]);
tokenCase("max-tokens", "small", ["--prompt", "hello", "--max-tokens", "5"]);
tokenCase("prompt-short", "small", ["-p", "tell me about the sea", "-m", "6"]);
tokenCase("system-prompt", "small", ["--prompt", "hi there", "--system-prompt", "Be brief.", "-m", "6"]);
tokenCase("prefill-response", "small", ["--prompt", "tell me a story", "--prefill-response", "Once upon", "-m", "6"]);
tokenCase("ignore-chat-template", "small", ["--prompt", "raw text here", "--ignore-chat-template", "-m", "6"]);
tokenCase("use-default-chat-template", "small", ["--prompt", "hello", "--use-default-chat-template", "-m", "6"]);
tokenCase("chat-template-config", "small", ["--prompt", "hello", "--chat-template-config", '{"enable_thinking": false}', "-m", "6"]);
tokenCase("prompt-escapes", "small", ["--prompt", "line one\\nline two\\tend", "-m", "6"]);
tokenCase("prompt-stdin", "small", ["--prompt", "-", "-m", "6"], { stdin: "from standard input" });
tokenCase("temp-top-p-seed", "small", ["--prompt", "hello", "--temp", "0.9", "--top-p", "0.9", "--seed", "3", "-m", "10"]);
tokenCase("top-k", "small", ["--prompt", "hello", "--temp", "1", "--top-k", "4", "--seed", "2", "-m", "10"]);
tokenCase("min-p-min-tokens-to-keep", "small", ["--prompt", "hello", "--temp", "1", "--min-p", "0.2", "--min-tokens-to-keep", "4", "--seed", "5", "-m", "10"]);
tokenCase("xtc", "small", ["--prompt", "hello", "--temp", "1", "--xtc-probability", "0.7", "--xtc-threshold", "0.05", "--seed", "4", "-m", "10"]);
tokenCase("max-kv-size", "small", ["--prompt", "hello", "--max-kv-size", "10", "-m", "12"]);
tokenCase("prefill-step-size", "small", ["--prompt", "hello", "--prefill-step-size", "5", "-m", "8"]);
tokenCase("kv-bits-default-start", "small", ["--prompt", "hello", "--kv-bits", "8", "--kv-group-size", "64", "-m", "8"]);
tokenCase("kv-bits-start-16", "dense", ["--prompt", "hello", "--kv-bits", "8", "--quantized-kv-start", "16", "-m", "12"], { quantizeFullOnly: true });
tokenCase("kv-bits-4-group-32-start-0", "dense", ["--prompt", "hello", "--kv-bits", "4", "--kv-group-size", "32", "--quantized-kv-start", "0", "-m", "12"], {
  quantizeFullOnly: true,
});
tokenCase("trust-remote-code", "small", ["--prompt", "hello", "--trust-remote-code", "-m", "6"]);
tokenCase("adapter-path", "small", ["--prompt", "hello", "--adapter-path", "<adapter>", "-m", "8"]);
tokenCase("adapter-path-seeded", "small", ["--prompt", "hello", "--adapter-path", "<adapter>", "--temp", "1", "--seed", "3", "-m", "8"]);
tokenCase("draft-model", "small", ["--prompt", "hello", "--draft-model", "<small>", "--num-draft-tokens", "2", "-m", "10"]);
tokenCase("quantize-activations-bf16", "small", ["--prompt", "hello", "-qa", "-m", "6"]);
tokenCase("quantized-checkpoint", "q4", ["--prompt", "hello", "-m", "8"]);
// --extra-eos-token (nargs="+": a token and a token id) is added in beforeAll, from a sampled run's tokens.

// Cases whose printed text is compared (ours without --json).
gen("verbose-F", "small", ["--prompt", "hello", "-m", "8", "--verbose", "F"]);
gen("verbose-False", "small", ["--prompt", "hello", "-m", "8", "--verbose", "False"]);
gen("verbose-T", "small", ["--prompt", "hello", "-m", "8", "--verbose", "T"]);
// Both refuse.
gen("quantize-activations-q4", "q4", ["--prompt", "hello", "--quantize-activations", "-m", "4"]);
gen("image", "small", ["--prompt", "hello", "--image", "<image>", "-m", "4"]);
// mlx_lm's own --kv-bits on Gemma 4 fails once the sliding layers' caches would be quantized.
gen("kv-bits-unpatched", "dense", ["--prompt", "hello", "--kv-bits", "8", "--quantized-kv-start", "16", "-m", "4"]);

// mlx_lm.chat: piped lines, q quits, r resets (the turn after a reset starts fresh on both sides).
const chatCase = (id: string, argv: string[], stdin: string): void => void cases.set(id, { command: "chat", model: "small", argv, stdin });
chatCase("chat-max-tokens-m", ["-m", "6"], "hello\nr\nhello\nq\n");
chatCase("chat-max-tokens", ["--max-tokens", "5", "--system-prompt", "Be terse."], "hi\nq\n");
chatCase("chat-seed-temp-top-p", ["-m", "6", "--temp", "0.8", "--top-p", "0.9", "--seed", "7"], "hello\nr\nhello\nq\n");
chatCase("chat-xtc-default-seed", ["-m", "6", "--temp", "1", "--xtc-probability", "0.6", "--xtc-threshold", "0.05"], "hi\nr\nhi\nq\n");
chatCase("chat-max-kv-size-prefill-step", ["-m", "6", "--max-kv-size", "12", "--prefill-step-size", "4"], "hello\nq\n");
chatCase("chat-trust-remote-code-pipeline", ["-m", "6", "--trust-remote-code", "--pipeline"], "hello\nq\n");
chatCase("chat-adapter-path", ["-m", "6", "--adapter-path", "<adapter>"], "hello\nq\n");

beforeAll(async () => {
  tmp = tempDir("mlxb-flags-");
  models.small = makeTinySmall(join(tmp.path, "small"));
  models.dense = join(tmp.path, "dense");
  runPython([MAKER, "--variant", "dense", "--out", models.dense]);
  models.q4 = makeTinySmall(join(tmp.path, "q4"), ["--quant", "4bit"]);
  // A 64-token window: a short prompt leaves the sliding caches unwrapped (mlx-lm then saves spare capacity).
  models.w64 = makeTinySmall(join(tmp.path, "w64"), ["--set", "sliding_window=64"]);
  adapter = join(tmp.path, "adapter");
  runPython([
    join(ROOT, "tools", "oracle", "lora_oracle.py"),
    models.small,
    adapter,
    join(tmp.path, "lora-ref.safetensors"),
    "--ids",
    "2,5,6",
    "--layers",
    "2",
    "--rank",
    "4",
    "--scale",
    "3.0",
  ]);
  const image = join(tmp.path, "a.ppm");
  writeFileSync(image, "P3\n1 1\n255\n255 0 0\n");
  for (const c of cases.values()) c.argv = c.argv.map((a) => (a === "<adapter>" ? adapter : a === "<small>" ? models.small : a === "<image>" ? image : a));

  // --extra-eos-token: two tokens a sampled run makes (its 4th as an id, its 6th as a token string).
  const probe = await runCli(["generate", "--model", models.small, "--prompt", "hello", "--temp", "1", "--seed", "3", "-m", "10", "--json"]);
  const ids = (JSON.parse(probe.stdout) as { generated_ids: number[] }).generated_ids;
  const tok = Gemma4Tokenizer.load(models.small);
  tokenCase("extra-eos-token", "small", [
    "--prompt",
    "hello",
    "--temp",
    "1",
    "--seed",
    "3",
    "-m",
    "10",
    "--extra-eos-token",
    String(ids[3]),
    tok.idToToken(ids[5]!)!,
  ]);

  // Prompt-cache files: ours first (mlx_lm reads them in the Python batch), then mlx_lm's (we read them after).
  files = {
    oursSmall: join(tmp.path, "ours-small.safetensors"),
    oursDenseQ: join(tmp.path, "ours-dense-q8.safetensors"),
    theirsSmall: join(tmp.path, "theirs-small.safetensors"),
    theirsDenseQ: join(tmp.path, "theirs-dense-q8.safetensors"),
    oursW64: join(tmp.path, "ours-w64.safetensors"),
    theirsW64: join(tmp.path, "theirs-w64.safetensors"),
  };
  cases.set("cache-ours-small", { command: "cache_prompt", model: "small", argv: ["--prompt", DOC, "--prompt-cache-file", files.oursSmall] });
  cases.set("cache-ours-dense-q8", {
    command: "cache_prompt",
    model: "dense",
    argv: ["--prompt", DOC, "--prompt-cache-file", files.oursDenseQ, "--kv-bits", "8", "--quantized-kv-start", "0", "--eos-token", "<pad>"],
  });
  cases.set("cache-theirs-small", { command: "cache_prompt", model: "small", argv: ["--prompt", DOC, "--prompt-cache-file", files.theirsSmall] });
  cases.set("cache-ours-w64", { command: "cache_prompt", model: "w64", argv: ["--prompt", "short one", "--prompt-cache-file", files.oursW64] });
  cases.set("cache-theirs-w64", { command: "cache_prompt", model: "w64", argv: ["--prompt", "short one", "--prompt-cache-file", files.theirsW64] });
  cases.set("cache-theirs-dense-q8", {
    command: "cache_prompt",
    model: "dense",
    argv: ["--prompt", DOC, "--prompt-cache-file", files.theirsDenseQ, "--kv-bits", "8", "--quantized-kv-start", "0"],
    quantizeFullOnly: true,
  });
  for (const [k, f] of Object.entries(files)) {
    // No --model: both load the model the file names (as mlx_lm.generate).
    tokenCase(`from-${k}`, null, ["--prompt-cache-file", f, "--prompt", " Now summarize it.", "-m", "10"]);
    tokenCase(`from-${k}-raw`, null, ["--prompt-cache-file", f, "--prompt", "and then", "--ignore-chat-template", "-m", "8"]);
  }
  tokenCase("from-oursSmall-prefill-response", null, [
    "--prompt-cache-file",
    files.oursSmall,
    "--prompt",
    "Summarize.",
    "--prefill-response",
    "In short",
    "-m",
    "8",
  ]);

  const oursCaches = ["cache-ours-small", "cache-ours-dense-q8", "cache-ours-w64"];
  for (const id of oursCaches) await runOurs(id, false);
  const pyIds = [...cases.keys()].filter((id) => !oursCaches.includes(id));
  // mlx_lm: the cache_prompt cases run before the generate cases that read their files.
  const order = [...pyIds.filter((id) => cases.get(id)!.command === "cache_prompt"), ...pyIds.filter((id) => cases.get(id)!.command !== "cache_prompt")];
  await runMlxLm(order);
  // Ours (mlx_lm's files exist now).
  const oursIds = [...cases.keys()].filter((id) => !id.startsWith("cache-"));
  await pool(oursIds, (id) => runOurs(id, TOKEN_CASES.includes(id)));
}, 600_000);

afterAll(() => tmp?.cleanup());

function expectSameTokens(id: string): void {
  const p = py.get(id)!;
  const o = ours.get(id)!;
  expect(p.error, `${id}: mlx_lm failed`).toBeNull();
  expect(o.code, `${id}: ${o.stderr}`).toBe(0);
  const j = JSON.parse(o.stdout) as { prompt_ids: number[]; generated_ids: number[] };
  expect(p.runs, id).toHaveLength(1);
  expect(j.prompt_ids, `${id}: prompt ids`).toEqual(p.runs[0]!.prompt);
  expect(j.generated_ids, `${id}: generated ids`).toEqual(p.runs[0]!.tokens);
  expect(j.generated_ids.length, id).toBeGreaterThan(0);
}

describe("mlx_lm.generate flags: same command line, same tokens", () => {
  for (const id of [
    "default",
    "max-tokens",
    "prompt-short",
    "system-prompt",
    "prefill-response",
    "ignore-chat-template",
    "use-default-chat-template",
    "chat-template-config",
    "prompt-escapes",
    "prompt-stdin",
    "temp-top-p-seed",
    "top-k",
    "min-p-min-tokens-to-keep",
    "xtc",
    "max-kv-size",
    "prefill-step-size",
    "kv-bits-default-start",
    "kv-bits-start-16",
    "kv-bits-4-group-32-start-0",
    "trust-remote-code",
    "adapter-path",
    "adapter-path-seeded",
    "draft-model",
    "quantize-activations-bf16",
    "quantized-checkpoint",
    "extra-eos-token",
  ]) {
    test(id, () => expectSameTokens(id));
  }

  test("-m is --max-tokens (as mlx_lm), and the sampled flags really sample", () => {
    expect((JSON.parse(ours.get("default")!.stdout) as { generated_ids: number[] }).generated_ids).toHaveLength(8);
    const greedy = py.get("default")!.runs[0]!.tokens;
    expect(py.get("temp-top-p-seed")!.runs[0]!.tokens).not.toEqual(greedy.concat(greedy).slice(0, 10));
  });

  test("--extra-eos-token a b: generation ends at the first of them", () => {
    const j = JSON.parse(ours.get("extra-eos-token")!.stdout) as { generated_ids: number[]; finish_reason: string };
    expect(j.finish_reason).toBe("stop");
    expect(j.generated_ids.length).toBeLessThanOrEqual(6);
  });

  test("--max-kv-size: no effect on Gemma 4 in either (the model's caches win); ours says so", () => {
    expect(py.get("max-kv-size")!.runs[0]!.tokens.slice(0, 8)).toEqual(py.get("default")!.runs[0]!.tokens);
    expect(ours.get("max-kv-size")!.stderr).toMatch(/--max-kv-size has no effect on Gemma 4, as in mlx_lm/);
  });

  test("--kv-bits: mlx_lm itself fails on Gemma 4 once the sliding caches would be quantized; ours quantizes the full-attention caches (the reference above)", () => {
    expect(py.get("kv-bits-unpatched")!.error).toMatch(/RotatingKVCache Quantization NYI/);
    // Quantizing changes the tokens (the comparison is not trivially the bf16 run's).
    expect(py.get("kv-bits-start-16")!.runs[0]!.tokens).not.toEqual(py.get("kv-bits-4-group-32-start-0")!.runs[0]!.tokens);
  });

  test("--verbose F / False prints the text only, T the text between separators, as mlx_lm", () => {
    for (const id of ["verbose-F", "verbose-False"]) {
      expect(py.get(id)!.error).toBeNull();
      expect(ours.get(id)!.stdout, id).toBe(py.get(id)!.stdout);
    }
    const theirs = py.get("verbose-T")!.stdout;
    const text = /^==========\n([\s\S]*)\n==========\nPrompt: /.exec(theirs)?.[1];
    expect(text, theirs).toBeDefined();
    const o = ours.get("verbose-T")!;
    expect(o.stdout).toBe(`${text}\n`);
    expect(o.stderr).toMatch(
      /^==========\n==========\nPrompt: \d+ tokens, [\d.]+ tokens-per-sec\nGeneration: 8 tokens, [\d.]+ tokens-per-sec\nPeak memory: [\d.]+ GB\n$/m,
    );
  });

  test("both refuse --quantize-activations on an affine-quantized checkpoint, and --image on a model without a vision tower", () => {
    expect(py.get("quantize-activations-q4")!.error).toMatch(/does not support activation quantization/);
    const q = ours.get("quantize-activations-q4")!;
    expect(q.code).toBe(1);
    expect(q.stderr).toMatch(
      /^mlx-bun: error: --quantize-activations: this checkpoint's layers are affine-quantized; only nvfp4 and mxfp8 layers support activation quantization/,
    );
    expect(py.get("image")!.error).toMatch(/does not take images/);
    const i = ours.get("image")!;
    expect(i.code).toBe(1);
    expect(i.stderr).toMatch(/^mlx-bun: error: --image: the model '.*' has no vision tower: it does not take images/m);
  });
});

describe("mlx_lm.chat flags: the same replies", () => {
  const BANNER = /^\[mlx-bun chat\] .*\n/;
  const replies = (id: string): string[] => {
    const p = py.get(id)!;
    expect(p.error, id).toBeNull();
    return p.runs.map((r) => r.text);
  };
  for (const id of [
    "chat-max-tokens-m",
    "chat-max-tokens",
    "chat-seed-temp-top-p",
    "chat-xtc-default-seed",
    "chat-max-kv-size-prefill-step",
    "chat-trust-remote-code-pipeline",
    "chat-adapter-path",
  ]) {
    test(id, () => {
      const o = ours.get(id)!;
      expect(o.code, o.stderr).toBe(0);
      const body = o.stdout.replace(BANNER, "");
      const theirs = replies(id);
      expect(body).toBe(theirs.map((t) => `${t}\n`).join("[history cleared]\n"));
    });
  }
  test("the turn after r (reset) continues mlx_lm.chat's seeded key stream: it differs from the first turn", () => {
    const [a, b] = replies("chat-seed-temp-top-p");
    expect(a).not.toBe(b);
  });
  test("--pipeline under `mlx-bun launch` is a clear error (tensor parallelism only)", async () => {
    const r = await runCli(["chat", "--model", models.small, "--pipeline"], { env: { MLX_BUN_DIST_BACKEND: "ring" }, stdin: "hi\n" });
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(
      /^mlx-bun: error: --pipeline: mlx-bun splits Gemma 4 tensor-parallel across `mlx-bun launch` ranks; pipeline parallelism is not implemented/,
    );
  });
});

describe("prompt-cache files both ways (mlx_lm.cache_prompt ↔ mlx-bun cache-prompt, --prompt-cache-file)", () => {
  test("both cache-prompt runs wrote their files", () => {
    for (const id of ["cache-ours-small", "cache-ours-dense-q8", "cache-ours-w64", "cache-theirs-small", "cache-theirs-dense-q8", "cache-theirs-w64"]) {
      if (id.startsWith("cache-ours")) expect(ours.get(id)!.code, ours.get(id)!.stderr).toBe(0);
      else expect(py.get(id)!.error, id).toBeNull();
    }
    expect(ours.get("cache-ours-small")!.stdout).toMatch(/Saved \d+ tokens to .*ours-small\.safetensors/);
  });
  for (const k of ["oursSmall", "oursDenseQ", "theirsSmall", "theirsDenseQ", "oursW64", "theirsW64"]) {
    test(`${k}: mlx_lm.generate and mlx-bun generate continue it with the same tokens`, () => {
      expectSameTokens(`from-${k}`);
      expectSameTokens(`from-${k}-raw`);
    });
  }
  test("--prefill-response with a cached prompt (mlx_lm's <query> split)", () => expectSameTokens("from-oursSmall-prefill-response"));
  test("the same prompt cached by either side continues the same way", () => {
    const a = JSON.parse(ours.get("from-oursSmall")!.stdout) as { generated_ids: number[] };
    const b = JSON.parse(ours.get("from-theirsSmall")!.stdout) as { generated_ids: number[] };
    expect(a.generated_ids).toEqual(b.generated_ids);
  });
  test("a file that is not a prompt cache, a missing one, and --kv-bits against the file's: clear errors", async () => {
    const bad = [
      [["generate", "--prompt-cache-file", join(models.small, "model.safetensors"), "--prompt", "x"], /not a prompt cache: neither an mlx-bun KV snapshot/],
      [
        ["generate", "--prompt-cache-file", join(tmp.path, "nope.safetensors"), "--prompt", "x"],
        /kv-store .*nope\.safetensors: not a readable snapshot: .*file not found/,
      ],
      [
        ["generate", "--prompt-cache-file", files.theirsDenseQ, "--kv-bits", "4", "--prompt", "x"],
        /--kv-bits 4 does not match the KV cache loaded from --prompt-cache-file \(8 bits\)/,
      ],
      [
        ["generate", "--prompt-cache-file", files.theirsSmall, "--model", models.dense, "--prompt", "x"],
        /the prompt cache .* was made with model .*; providing a different model is an error/,
      ],
      [["generate", "--prompt-cache-file", files.oursSmall, "--model", models.q4, "--prompt", "x"], /saved from another model/],
    ] as const;
    for (const [args, re] of bad) {
      const r = await runCli([...args]);
      expect(r.code, args.join(" ")).toBe(1);
      expect(r.stderr, args.join(" ")).toMatch(re);
      expect(r.stderr).not.toMatch(/\n\s+at /); // no stack trace
    }
  });
  test("chat --prompt-cache-file: the first reply is mlx_lm.generate's on the same file and prompt", async () => {
    const r = await runCli(["chat", "--prompt-cache-file", files.theirsSmall, "-m", "10"], { stdin: " Now summarize it.\nq\n" });
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout.replace(/^\[mlx-bun chat\] .*\n/, "")).toBe(`${py.get("from-theirsSmall")!.runs[0]!.text}\n`);
  });
  test("cache-prompt --eos-token is kept for generate (tokenizer_config.eos_token, as mlx_lm)", async () => {
    const { readPromptCacheInfo } = await import("@mlx-bun/runtime");
    expect(readPromptCacheInfo(files.oursDenseQ).tokenizerConfig).toEqual({ trust_remote_code: false, eos_token: "<pad>" });
  });
});

test("mlx_lm's model constructors take one key per Linear / Embedding from the seeded stream: our count matches", async () => {
  const moe = join(tmp.path, "moe");
  runPython([MAKER, "--variant", "moe", "--out", moe]);
  const script = join(tmp.path, "draws.py");
  writeFileSync(
    script,
    [
      "import sys, mlx.core as mx",
      "from mlx_lm import load",
      "for d in sys.argv[1:]:",
      "    mx.random.seed(3); load(d); after = mx.random.state[0]",
      "    mx.random.seed(3); k = mx.random.state[0]; n = 0",
      "    while not mx.array_equal(k, after).item():",
      "        k, _ = mx.random.split(k); n += 1",
      "    print(n)",
    ].join("\n"),
  );
  const want = runPython([script, models.small, models.dense, moe, models.q4]).trim().split("\n").map(Number);
  const { mlxLmLoadDraws } = await import("../src/commands/mlx-lm-seed.ts");
  const { loadModel } = await import("@mlx-bun/models");
  const got = [models.small, models.dense, moe, models.q4].map((d) => {
    using m = loadModel(d);
    return mlxLmLoadDraws(m);
  });
  expect(got).toEqual(want);
});
