#!/usr/bin/env bun
// mlx-bun: generate, chat and serve (an OpenAI-compatible server) on MLX, from Bun. Every flag of
// mlx_lm.generate, mlx_lm.chat, mlx_lm.server and mlx_lm.cache_prompt is accepted with its meaning
// (docs/server.md has the table); ours are extras that do not collide.
import { Command, Option } from "commander";
import { downloadModel } from "./hub.ts";
import {
  addDraftOptions,
  addKvQuantOptions,
  addLogLevelOption,
  addModelOptions,
  addPipelineOption,
  addSamplingOptions,
  boolArg,
  floatArg,
  intArg,
  jsonObjectArg,
  sizeArg,
} from "./options.ts";
import { VERSION } from "./version.ts";

const program = new Command("mlx-bun")
  .description("Native MLX LLM inference for Bun: generate, chat, and an OpenAI-compatible server (drop-in for mlx_lm.server).")
  .version(VERSION)
  .showHelpAfterError("(run with --help for usage)")
  .enablePositionalOptions()
  .addHelpText(
    "after",
    `
Models: --model takes a local directory or a Hugging Face repo id (downloaded into
$MLX_BUN_CACHE, default ~/.cache/mlx-bun/hub; hub URL from $MLX_BUN_HF_ENDPOINT or $HF_ENDPOINT).
Without --model the bundled tiny model of tools/setup.sh is used.

Examples:
  mlx-bun generate --prompt "Write a haiku" -m 64
  mlx-bun generate --json --prompt hello --max-tokens 8
  mlx-bun cache-prompt --prompt "<a long document>" --prompt-cache-file doc.safetensors
  mlx-bun generate --prompt-cache-file doc.safetensors --prompt "Summarize it."
  mlx-bun chat --system-prompt "You are terse."
  mlx-bun serve --port 8080 --kv q8 --prompt-cache-dir ~/.cache/mlx-bun/prompts
  mlx-bun verify doc.safetensors`,
  );

/** Errors whose message says everything (bad input): printed alone, never with a stack trace. */
const USER_ERRORS = new Set([
  "UsageError",
  "ModelNotFoundError",
  "KvStoreError",
  "ConfigError",
  "WeightsError",
  "SafetensorsError",
  "LaunchError",
  "PromptCacheError",
  "RequestError",
  "KvCacheError",
  "HubError",
  "VerifyError",
]);

const exitWith = (p: Promise<number>) =>
  p.then(
    (code) => process.exit(code),
    (e) => {
      const known = e instanceof Error && USER_ERRORS.has(e.name);
      const msg = known || process.env.MLX_BUN_DEBUG !== "1" ? ((e as Error)?.message ?? String(e)) : ((e as Error)?.stack ?? String(e));
      process.stderr.write(`mlx-bun: ${e?.name === "ModelNotFoundError" ? "" : "error: "}${msg}\n`);
      process.exit(1);
    },
  );

const collect = (v: string, prev: string[] = []) => [...prev, v];
/** Variadic options (argparse nargs="+"): values given across repeats are kept together. */
const collectMany = (v: string, prev: string[] | undefined) => [...(prev ?? []), v];

addDraftOptions(
  addKvQuantOptions(
    addSamplingOptions(addModelOptions(program.command("generate").description("generate text for one prompt (mlx_lm.generate)")), 100, {
      shortMaxTokens: true,
    }),
  ),
)
  .option("-p, --prompt <text>", 'the prompt ("-" reads stdin)', "hello")
  .option("--system-prompt <text>", "system message for the chat template")
  .option("--prefill-response <text>", "start of the assistant's reply, continued by the model (chat template)")
  .option("--ignore-chat-template", "use the raw prompt without the chat template")
  .option("--use-default-chat-template", "accepted for mlx_lm compatibility; no effect (as in mlx_lm.generate)")
  .option("--chat-template-config <json>", "extra apply_chat_template arguments, a JSON object", jsonObjectArg("--chat-template-config"))
  .addOption(new Option("--extra-eos-token <tokens...>", "more tokens (or token ids) that end generation").argParser(collectMany))
  .option("--min-tokens-to-keep <n>", "tokens min-p sampling always keeps", intArg("--min-tokens-to-keep", 1), 1)
  .option("--prompt-cache-file <file>", "start from the KV caches of this file (mlx-bun cache-prompt or mlx_lm.cache_prompt); the prompt continues it")
  .option("--quantize-activations", "as mlx_lm's -qa: only for nvfp4/mxfp8 layers (not implemented); nothing to do for bf16 checkpoints")
  .addOption(
    new Option(
      "--image <files...>",
      "images for a model with a vision tower (paths or file:, data:, http(s) URLs), placed before the prompt's text (as mlx_vlm.generate)",
    ).argParser(collectMany),
  )
  .option("--verbose <bool>", "T/True: text and stats; F/False: the text only (as mlx_lm)", boolArg, true)
  .option("--no-verbose", "print only the text, no stats")
  .option("--json", "print one JSON line: {prompt, prompt_ids, generated_ids, text, timings}")
  .action((o) => exitWith(import("./commands/generate.ts").then((m) => m.runGenerate(o))));

addPipelineOption(
  addSamplingOptions(addModelOptions(program.command("chat").description("interactive chat in the terminal (mlx_lm.chat)")), 256, {
    shortMaxTokens: true,
    seed: 0,
  }),
)
  .option("--system-prompt <text>", "system message")
  .option("--chat-template-config <json>", "extra apply_chat_template arguments, a JSON object", jsonObjectArg("--chat-template-config"))
  .option("--prompt-cache-file <file>", "start from the KV caches of this file: the start of the first message (as mlx_lm.generate reads it)")
  .option("-v, --verbose", "print token counts and speed after each reply")
  .action((o) => exitWith(import("./commands/chat.ts").then((m) => m.runChat(o))));

addLogLevelOption(
  addPipelineOption(
    addDraftOptions(
      addKvQuantOptions(addSamplingOptions(addModelOptions(program.command("serve").description("OpenAI-compatible HTTP server (mlx_lm.server)")), 512)),
    ),
  ),
)
  .option("--host <host>", "address to listen on", "127.0.0.1")
  .option("--port <port>", "port to listen on (0 = any free port)", intArg("--port", 0), 8080)
  .addOption(new Option("--api-key <key>", "require 'Authorization: Bearer <key>'").env("MLX_BUN_API_KEY"))
  .option("--decode-concurrency <n>", "requests decoded together at most (default 32, as mlx_lm.server)", intArg("--decode-concurrency", 1))
  .option("--max-batch <n>", "the same as --decode-concurrency", intArg("--max-batch", 1))
  .option("--prompt-concurrency <n>", "waiting requests prefilled together at most", intArg("--prompt-concurrency", 1), 8)
  .option("--memory-budget <bytes>", "KV memory the scheduler may admit requests into", floatArg("--memory-budget", 1))
  .option("--prompt-cache-size <n>", "prompt caches kept for prefix reuse (0 = off), as mlx_lm.server", intArg("--prompt-cache-size", 0), 10)
  .option("--prompt-cache-bytes <size>", "byte budget of the prompt cache (e.g. 1073741824, 500M, 2GB)", sizeArg("--prompt-cache-bytes"), 1024 ** 3)
  .option("--prompt-cache-file <file>", "put this file's caches (mlx-bun cache-prompt) into the prompt cache at start")
  .option("--prompt-cache-dir <dir>", "restore the prompt cache from this folder at start, save it there at shutdown (SIGINT/SIGTERM)")
  .option("--max-body-size <bytes>", "largest request body", intArg("--max-body-size", 1), 16 * 1024 * 1024)
  .option(
    "--allowed-origins <list>",
    "web origins whose pages may call the API (CORS), comma separated; * = any (default: none but the server's own page)",
    (v: string) => v.split(","),
    [],
  )
  .option(
    "--allowed-hosts <list>",
    "Host names accepted besides localhost, 127.0.0.1, [::1] and --host (DNS-rebinding check of a keyless loopback server); * = no check",
    (v: string) => v.split(","),
    [],
  )
  .option("--idle-timeout <s>", "close a connection silent for this long (keep-alive, a stalled body); 1..255", floatArg("--idle-timeout", 1, 255), 30)
  .option("--body-timeout <s>", "time to receive a whole request body (408 beyond it)", floatArg("--body-timeout", 0.001), 60)
  .option(
    "--write-timeout <s>",
    "cancel a streamed request, and close its connection, when the client has not read for this long",
    floatArg("--write-timeout", 0.001),
    30,
  )
  .option(
    "--max-buffered-output <bytes>",
    "streamed output a response may hold unread before the request is cancelled (e.g. 4194304, 4M)",
    sizeArg("--max-buffered-output"),
    4 * 1024 * 1024,
  )
  .option("--template-timeout <s>", "time a chat template may take to render one prompt (400 beyond it)", floatArg("--template-timeout", 0.001), 5)
  .option("--chat-template <template>", "a Jinja chat template to use instead of the model's", "")
  .option("--use-default-chat-template", "accepted for mlx_lm compatibility (transformers has no default template)")
  .option("--chat-template-args <json>", "apply_chat_template arguments for every request, a JSON object", jsonObjectArg("--chat-template-args"))
  .option("--any-model", "accept any 'model' name in requests (default: 404 for a name other than the served one)")
  .option("--no-log", "no request log on stderr")
  .option("--no-web", "no web chat page at / (the API only)")
  .option("--allow-remote-images", "fetch http(s) image_url parts (default: refused with a 400; data: URLs and local files work)")
  .action((o) => exitWith(import("./commands/serve.ts").then((m) => m.runServe(o))));

addKvQuantOptions(
  addModelOptions(program.command("cache-prompt").description("run a prompt and save its KV caches for --prompt-cache-file (mlx_lm.cache_prompt)")),
)
  .requiredOption("--prompt <text>", 'the prompt to cache ("-" reads stdin)')
  .requiredOption("--prompt-cache-file <file>", "the file to write (mlx-lm's save_prompt_cache format)")
  .option("--eos-token <token>", "end-of-sequence token stored for generate (tokenizer_config.eos_token, as mlx_lm)")
  .action((o) => exitWith(import("./commands/cache-prompt.ts").then((m) => m.runCachePrompt(o))));

program
  .command("verify")
  .description("check a KV snapshot, an mlx-lm prompt cache or a checkpoint (directory or .safetensors file)")
  .argument("<paths...>", "files or checkpoint directories")
  .option("--json", "one JSON line per path")
  .action((paths: string[], o) => exitWith(import("./commands/verify.ts").then((m) => m.runVerify(paths, o))));

program
  .command("launch")
  .description("run a command on several ranks, as mlx.launch: tensor-parallel generate/serve across processes or hosts")
  .option("-n, --n <n>", "this many local processes on loopback", intArg("-n", 1))
  .option("--hostfile <file>", "mlx.launch host file (JSON: hosts with ssh names and ips)")
  .option("--backend <name>", "ring | nccl | any (nccl where CUDA is live, else ring)", "any")
  .option("--timeout <seconds>", "stop the group when a rank is silent this long", floatArg("--timeout", 0.1), 30)
  .option("--starting-port <port>", "first ring port (default: free ports)", intArg("--starting-port", 1))
  .option("--nccl-port <port>", "NCCL rendezvous port", intArg("--nccl-port", 1))
  .option("--env <KEY=VALUE>", "environment for every rank (repeatable)", collect)
  .argument("<command...>", "an mlx-bun command (generate, serve, chat) with its options, or any program")
  .passThroughOptions()
  .addHelpText("after", "\nExample:\n  mlx-bun launch -n 2 -- generate --model <dir> --prompt hello --max-tokens 32")
  .action((command: string[], o) => exitWith(import("./commands/launch.ts").then((m) => m.runLaunch(command, o))));

program
  .command("download")
  .description("download a model from the Hugging Face Hub into the cache and print its directory")
  .argument("<repo>", "owner/name")
  .option("--revision <rev>", "branch, tag or commit", "main")
  .action((repo: string, o: { revision: string }) =>
    exitWith(
      downloadModel(repo, { revision: o.revision }).then((dir) => {
        process.stdout.write(`${dir}\n`);
        return 0;
      }),
    ),
  );

// mlx_lm's two-letter short option -qa (argparse) has no commander form: spell it out.
const argv = process.argv.map((a, i) => (i > 1 && a === "-qa" ? "--quantize-activations" : a));
await program.parseAsync(argv);
