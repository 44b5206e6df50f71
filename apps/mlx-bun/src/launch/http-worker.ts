// Rank 0's HTTP front when `mlx-bun serve` runs across ranks: the ordinary server (server/http.ts)
// in a Bun Worker, so it keeps answering while the model thread is blocked inside a native
// collective waiting on a hung peer. Requests cross to the model thread as messages; when the
// model thread sends no tick for `stallMs`, every open request fails with a 503 (for streams, an
// SSE error event, then the end) and new ones are refused; so do they when the launcher's stop
// notice arrives on MLX_BUN_CONTROL_FD (docs/distributed.md, failure behaviour).
import { ChatTemplate, Gemma4Tokenizer, loadGemma4Config } from "@mlx-bun/models";
import { EventChannel, type GenerateRequest, type GenerationStream, validateRequest } from "@mlx-bun/runtime";
import { ApiError } from "../server/errors.ts";
import { type RunningServer, startServer } from "../server/http.ts";
import type { ToModel, ToWorker, WireError, WorkerInit } from "./serve-protocol.ts";

declare const self: Worker;
const post = (m: ToModel): void => self.postMessage(m);

const open = new Map<number, EventChannel>();
let nextId = 1;
let lastTick = Date.now();
/** Why the group can no longer serve; set once. */
let down: ApiError | null = null;
let srv: RunningServer | null = null;

function toError(w: WireError): Error {
  if (w.status !== undefined) return new ApiError(w.status, w.message, null, w.status === 503 ? "group_unavailable" : null);
  const e = new Error(w.message);
  // toApiError maps the runtime's RequestError (by name) to a 400.
  e.name = w.name;
  return e;
}

/** Fail every open request and refuse new ones. */
function goDown(e: ApiError): void {
  if (down) return;
  down = e;
  for (const ch of open.values()) ch.fail(e);
  open.clear();
}

function start(init: WorkerInit): void {
  const dir = init.dir;
  const config = loadGemma4Config(dir);
  const tokenizer = Gemma4Tokenizer.load(dir);
  let template: ChatTemplate | null = null;
  try {
    template = ChatTemplate.load(dir, tokenizer);
  } catch {
    template = null;
  }
  const limits = { maxContext: config.text.maxPositionEmbeddings, maxKvSize: init.maxKvSize, loaded: { tokenizer } };
  const sink = {
    get active(): number {
      return open.size;
    },
    submit(req: GenerateRequest): GenerationStream {
      if (down) throw down;
      // The checks Scheduler.submit makes, here, so a bad request is a 400 before any stream starts.
      validateRequest(req, limits);
      const id = nextId++;
      const ch = new EventChannel();
      open.set(id, ch);
      const { signal, ...wire } = req;
      signal?.addEventListener("abort", () => open.has(id) && post({ t: "cancel", id }), { once: true });
      post({ t: "submit", id, req: wire });
      return ch;
    },
  };
  srv = startServer({
    ...init.server,
    model: { dir, tokenizer, template, config },
    scheduler: sink,
    ...(init.log ? { log: (l: string) => process.stderr.write(`${new Date().toISOString()} ${l}\n`) } : {}),
  });
  post({ t: "listening", url: srv.url, webChat: srv.webChat });
  void readControl();
  const watch = setInterval(() => {
    if (down || Date.now() - lastTick <= init.stallMs) return;
    goDown(
      new ApiError(
        503,
        `the tensor-parallel group stopped responding: rank 0 made no progress for ${(init.stallMs / 1000).toFixed(1)} s (a rank died or hung); the group is being stopped`,
        null,
        "group_unavailable",
      ),
    );
    // Under `mlx-bun launch` the launcher stops the group now; a rank 0 nobody watches ends itself.
    setTimeout(() => process.kill(process.pid, "SIGKILL"), init.stallMs + 5000).unref();
  }, Math.min(250, init.stallMs / 4));
  watch.unref();
}

/** The launcher's stop notice (launcher.ts CONTROL_FD): it names the failed rank, and it arrives while this process's model thread may be blocked. */
async function readControl(): Promise<void> {
  const fd = Number(process.env.MLX_BUN_CONTROL_FD);
  if (!Number.isInteger(fd) || fd < 0) return;
  let buf = "";
  try {
    const dec = new TextDecoder();
    for await (const chunk of Bun.file(fd).stream()) {
      buf += dec.decode(chunk, { stream: true });
      const line = buf.split("\n").find((l) => l.startsWith("stop "));
      if (line) goDown(new ApiError(503, `the tensor-parallel group is being stopped: ${line.slice(5)}`, null, "group_unavailable"));
    }
  } catch {
    // no control channel (not started by the launcher)
  }
}

self.onmessage = async (e: MessageEvent<ToWorker>) => {
  const m = e.data;
  lastTick = Date.now();
  if (m.t === "init") {
    try {
      start(m.init);
    } catch (err) {
      post({ t: "startFailed", error: { name: (err as Error).name, message: (err as Error).message } });
    }
    return;
  }
  if (m.t === "tick") return;
  if (m.t === "shutdown") {
    goDown(new ApiError(m.error.status ?? 503, m.error.message, null, m.error.status === 500 ? null : "group_unavailable"));
    // Let the error events and responses go out before the listener closes.
    await Bun.sleep(100);
    await srv?.stop();
    post({ t: "closed" });
    return;
  }
  const ch = open.get(m.id);
  if (!ch) return;
  if (m.t === "event") ch.push(m.ev);
  else if (m.t === "done") {
    open.delete(m.id);
    ch.finish(m.result);
  } else {
    open.delete(m.id);
    ch.fail(toError(m.error));
  }
};
