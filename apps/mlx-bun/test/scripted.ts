// A tiny random model made to write a fixed output: a RequestSink over a real Scheduler that,
// while scripts are queued, adds a logits processor allowing one token per step (the script's
// tokens, then the end-of-turn token). The server's parsing, formatting and streaming are what a
// test then checks, with real generation underneath.
import { join } from "node:path";
import { Engine, type GenerateRequest, type GenerationStream, type LogitsProcessor, maskIds, Scheduler } from "@mlx-bun/runtime";
import { type RunningServer, startServer } from "../src/server/http.ts";
import type { ServerOptions } from "../src/server/server-options.ts";
import { makeTinySmall, tempDir } from "./helpers.ts";

/** Allows only ids[k] at generated step k, then `eos`. */
export function forceTokens(ids: readonly number[], eos: number): LogitsProcessor {
  let base = -1;
  return {
    process(history, logits) {
      if (base < 0) base = history.length;
      const k = history.length - base;
      const want = k < ids.length ? ids[k]! : eos;
      const V = logits.shape[logits.ndim - 1]!;
      const all = Array.from({ length: V }, (_, i) => i).filter((i) => i !== want);
      return maskIds(logits, all);
    },
  };
}

export interface ScriptedSink {
  readonly active: number;
  readonly batchSize: number;
  readonly promptCache: Scheduler["promptCache"];
  submit(req: GenerateRequest): GenerationStream;
  /** What the next requests write (FIFO), as text with special tokens. */
  scripts: string[];
  /** Every request submitted, in order. */
  seen: GenerateRequest[];
}

export function scriptedSink(engine: Engine, scheduler: Scheduler): ScriptedSink {
  const tok = engine.loaded.tokenizer;
  const eos = tok.tokenToId("<turn|>")!;
  const scripts: string[] = [];
  const seen: GenerateRequest[] = [];
  return {
    scripts,
    seen,
    get active() {
      return scheduler.active;
    },
    get batchSize() {
      return scheduler.batchSize;
    },
    get promptCache() {
      return scheduler.promptCache;
    },
    submit(req: GenerateRequest): GenerationStream {
      seen.push(req);
      const script = scripts.shift();
      if (script === undefined) return scheduler.submit(req);
      const ids = tok.encode(script, { addSpecialTokens: false });
      return scheduler.submit({ ...req, logitsProcessors: [...(req.logitsProcessors ?? []), forceTokens(ids, eos)] });
    },
  };
}

/** A tiny random model served over a scripted sink (the endpoint tests' set-up). */
export interface ScriptedServer {
  /** The tiny checkpoint's folder. */
  dir: string;
  engine: Engine;
  scheduler: Scheduler;
  sink: ScriptedSink;
  srv: RunningServer;
  /** Another server over the same sink (e.g. one with an API key); stopped with the rest. */
  also(opts: Partial<ServerOptions>): RunningServer;
  stop(): Promise<void>;
}

/** make_tiny_model.py --variant small in a temporary folder, a Scheduler (batch 4), a scripted sink, and a server on port 0. */
export function startScriptedServer(prefix: string, modelId: string): ScriptedServer {
  const tmp = tempDir(prefix);
  const dir = makeTinySmall(join(tmp.path, "tiny"));
  const engine = Engine.load(dir);
  const scheduler = new Scheduler(engine, { maxBatch: 4 });
  const sink = scriptedSink(engine, scheduler);
  const base = { model: engine.loaded, scheduler: sink, modelId, port: 0, webDir: null };
  const servers = [startServer(base)];
  return {
    dir,
    engine,
    scheduler,
    sink,
    srv: servers[0]!,
    also(opts) {
      const s = startServer({ ...base, ...opts });
      servers.push(s);
      return s;
    },
    async stop() {
      for (const s of servers) await s.stop();
      await scheduler.close();
      engine.dispose();
      tmp.cleanup();
    },
  };
}
