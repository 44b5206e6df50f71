#!/usr/bin/env bun
// mlx-bun: generate, chat and serve (an OpenAI-compatible server) on MLX, from Bun.
import { Command, Option } from "commander";
import { downloadModel } from "./hub.ts";
import { ModelNotFoundError } from "./model-path.ts";
import { addDraftOptions, addModelOptions, addSamplingOptions, floatArg, intArg, jsonObjectArg } from "./options.ts";
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
  mlx-bun generate --prompt "Write a haiku" --max-tokens 64
  mlx-bun generate --json --prompt hello --max-tokens 8
  mlx-bun chat --system-prompt "You are terse."
  mlx-bun serve --port 8080 --kv q8`,
  );

const exitWith = (p: Promise<number>) =>
  p.then(
    (code) => process.exit(code),
    (e) => {
      const msg = e instanceof ModelNotFoundError ? e.message : ((e as Error)?.stack ?? String(e));
      process.stderr.write(`mlx-bun: ${e instanceof ModelNotFoundError ? "" : "error: "}${msg}\n`);
      process.exit(1);
    },
  );

const collect = (v: string, prev: string[] = []) => [...prev, v];

addDraftOptions(addSamplingOptions(addModelOptions(program.command("generate").description("generate text for one prompt (mlx_lm.generate)")), 100))
  .option("-p, --prompt <text>", 'the prompt ("-" reads stdin)', "hello")
  .option("--ignore-chat-template", "use the raw prompt without the chat template")
  .option("--system-prompt <text>", "system message for the chat template")
  .option("--chat-template-config <json>", "extra apply_chat_template arguments, a JSON object", jsonObjectArg("--chat-template-config"))
  .option("--extra-eos-token <token>", "another token that ends generation (repeatable)", collect)
  .option("--json", "print one JSON line: {prompt, prompt_ids, generated_ids, text, timings}")
  .option("--no-verbose", "print only the text, no stats")
  .action((o) => exitWith(import("./commands/generate.ts").then((m) => m.runGenerate(o))));

addSamplingOptions(addModelOptions(program.command("chat").description("interactive chat in the terminal (mlx_lm.chat)")), 256)
  .option("--system-prompt <text>", "system message")
  .option("--chat-template-config <json>", "extra apply_chat_template arguments, a JSON object", jsonObjectArg("--chat-template-config"))
  .option("-v, --verbose", "print token counts and speed after each reply")
  .action((o) => exitWith(import("./commands/chat.ts").then((m) => m.runChat(o))));

addDraftOptions(addSamplingOptions(addModelOptions(program.command("serve").description("OpenAI-compatible HTTP server (mlx_lm.server)")), 512))
  .option("--host <host>", "address to listen on", "127.0.0.1")
  .option("--port <port>", "port to listen on (0 = any free port)", intArg("--port", 0), 8080)
  .addOption(new Option("--api-key <key>", "require 'Authorization: Bearer <key>'").env("MLX_BUN_API_KEY"))
  .option("--max-batch <n>", "requests decoded together at most", intArg("--max-batch", 1))
  .option("--memory-budget <bytes>", "KV memory the scheduler may admit requests into", floatArg("--memory-budget", 1))
  .option("--prompt-cache-size <n>", "prompt caches kept for prefix reuse (0 = off), as mlx_lm.server", intArg("--prompt-cache-size", 0), 10)
  .option("--prompt-cache-bytes <bytes>", "byte budget of the prompt cache", floatArg("--prompt-cache-bytes", 0), 1024 ** 3)
  .option("--max-body-size <bytes>", "largest request body", intArg("--max-body-size", 1), 16 * 1024 * 1024)
  .option("--allowed-origins <list>", "CORS origins, comma separated", (v: string) => v.split(","), ["*"])
  .option("--chat-template-args <json>", "apply_chat_template arguments for every request, a JSON object", jsonObjectArg("--chat-template-args"))
  .option("--any-model", "accept any 'model' name in requests (default: 404 for a name other than the served one)")
  .option("--no-log", "no request log on stderr")
  .option("--no-web", "no web chat page at / (the API only)")
  .action((o) => exitWith(import("./commands/serve.ts").then((m) => m.runServe(o))));

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

await program.parseAsync(process.argv);
