// The HTTP front of `mlx-bun serve` across ranks (docs/distributed.md, serve across ranks): the
// ordinary server (server/http.ts) whose requests cross to rank 0's Engine as messages
// (serve-protocol.ts). It runs where no MLX collective can block or crash it: in the launcher
// process (launcher.ts, over a socket to rank 0), or, when rank 0 is not a local child of the
// launcher, in a Worker of rank 0 (http-worker.ts). `goDown` fails every open request with an
// OpenAI-shaped 5xx (a stream: an SSE error event, then the end; never [DONE]) and refuses new ones.
import { loadTextSide } from "@mlx-bun/models";
import { EventChannel, type GenerateRequest, type GenerationStream, validateRequest } from "@mlx-bun/runtime";
import { ApiError } from "../server/errors.ts";
import { type RunningServer, startServer } from "../server/http.ts";
import type { ToModel, ToWorker, WireError, WorkerInit } from "./serve-protocol.ts";

function toError(w: WireError): Error {
  if (w.status !== undefined) return new ApiError(w.status, w.message, null, w.status === 503 ? "group_unavailable" : null);
  const e = new Error(w.message);
  // toApiError maps the runtime's RequestError (by name) to a 400.
  e.name = w.name;
  return e;
}

export class ServeFront {
  readonly #open = new Map<number, EventChannel>();
  #nextId = 1;
  #down: ApiError | null = null;
  #srv: RunningServer | null = null;

  /** `post` sends to rank 0's model thread. */
  constructor(readonly post: (m: ToModel) => void) {}

  get url(): string | null {
    return this.#srv?.url ?? null;
  }

  /** Requests answered or streaming now. */
  get openRequests(): number {
    return this.#open.size;
  }

  get isDown(): boolean {
    return this.#down !== null;
  }

  /** Start listening (the model's tokenizer, template and limits are read from `init.dir`); answers "listening" or "startFailed". */
  start(init: WorkerInit): void {
    try {
      const dir = init.dir;
      const { config, tokenizer, template } = loadTextSide(dir);
      const limits = { maxContext: config.text.maxPositionEmbeddings, maxKvSize: init.maxKvSize, loaded: { tokenizer } };
      const open = this.#open;
      const sink = {
        get active(): number {
          return open.size;
        },
        submit: (req: GenerateRequest): GenerationStream => {
          if (this.#down) throw this.#down;
          // The checks Scheduler.submit makes, here, so a bad request is a 400 before any stream starts.
          validateRequest(req, limits);
          const id = this.#nextId++;
          const ch = new EventChannel();
          open.set(id, ch);
          const { signal, ...wire } = req;
          signal?.addEventListener("abort", () => open.has(id) && this.post({ t: "cancel", id }), { once: true });
          this.post({ t: "submit", id, req: wire });
          return ch;
        },
      };
      this.#srv = startServer({
        ...init.server,
        model: { dir, tokenizer, template, config },
        scheduler: sink,
        ...(init.log ? { log: (l: string) => process.stderr.write(`${new Date().toISOString()} ${l}\n`) } : {}),
      });
      this.post({ t: "listening", url: this.#srv.url, webChat: this.#srv.webChat });
    } catch (err) {
      this.post({ t: "startFailed", error: { name: (err as Error).name, message: (err as Error).message } });
    }
  }

  /** Fail every open request with `status` (5xx) naming `message`, and refuse new ones; the first call wins. */
  goDown(status: number, message: string): void {
    if (this.#down) return;
    this.#down = new ApiError(status, message, null, status === 503 ? "group_unavailable" : null);
    for (const ch of this.#open.values()) ch.fail(this.#down);
    this.#open.clear();
  }

  /** A message from rank 0's model thread. */
  async receive(m: ToWorker): Promise<void> {
    if (m.t === "init") return this.start(m.init);
    if (m.t === "tick") return;
    if (m.t === "shutdown") {
      this.goDown(m.error.status ?? 503, m.error.message);
      // Let the error events and responses go out before the listener closes.
      await Bun.sleep(100);
      await this.stop();
      this.post({ t: "closed" });
      return;
    }
    const ch = this.#open.get(m.id);
    if (!ch) return;
    if (m.t === "event") ch.push(m.ev);
    else if (m.t === "done") {
      this.#open.delete(m.id);
      ch.finish(m.result);
    } else {
      this.#open.delete(m.id);
      ch.fail(toError(m.error));
    }
  }

  /** Close the listener (after `goDown`, give the error events a moment to go out first). */
  async stop(): Promise<void> {
    const srv = this.#srv;
    this.#srv = null;
    await srv?.stop();
  }
}
