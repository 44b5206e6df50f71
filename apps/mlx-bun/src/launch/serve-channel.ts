// The channel between the launcher's HTTP front and rank 0's model thread (serve across ranks,
// docs/distributed.md): serve-protocol.ts messages as JSON lines over a local socket. A socket,
// not a thread: when rank 0's process dies (any signal, a segfault included) the kernel closes it
// and the front sees a clean end, so it can still answer every open request.
import { createConnection, type Socket } from "node:net";

/** The env var that gives rank 0 the socket path of the launcher's front (set by launcher.ts for `serve`). */
export const SERVE_FRONT_ENV = "MLX_BUN_SERVE_FRONT";

// JSON has no Infinity/NaN (a logprob may be -Infinity): they cross as {"$nf": "-Infinity"}.
const replacer = (_k: string, v: unknown): unknown => (typeof v === "number" && !Number.isFinite(v) ? { $nf: String(v) } : v);
const reviver = (_k: string, v: unknown): unknown =>
  v !== null && typeof v === "object" && !Array.isArray(v) && Object.keys(v).length === 1 && typeof (v as { $nf?: unknown }).$nf === "string"
    ? Number((v as { $nf: string }).$nf)
    : v;

/** One end of the channel: `send` a message, `onMessage` for each one received, `onEnd` once when the other side is gone. */
export class LineChannel<In, Out> {
  #buf = "";
  #ended = false;
  onMessage: (m: In) => void = () => {};
  onEnd: (why: string) => void = () => {};

  constructor(readonly socket: Socket) {
    socket.setEncoding("utf8");
    socket.on("data", (chunk: string) => {
      this.#buf += chunk;
      for (let i = this.#buf.indexOf("\n"); i >= 0; i = this.#buf.indexOf("\n")) {
        const line = this.#buf.slice(0, i);
        this.#buf = this.#buf.slice(i + 1);
        if (!line) continue;
        let m: In;
        try {
          m = JSON.parse(line, reviver) as In;
        } catch (e) {
          this.#end(`a malformed message on the serve channel (${(e as Error).message})`);
          socket.destroy();
          return;
        }
        this.onMessage(m);
      }
    });
    socket.on("error", (e) => this.#end(e.message));
    socket.on("close", () => this.#end("the other side closed the channel"));
  }

  #end(why: string): void {
    if (this.#ended) return;
    this.#ended = true;
    this.onEnd(why);
  }

  get ended(): boolean {
    return this.#ended;
  }

  send(m: Out): void {
    if (this.#ended) return;
    this.socket.write(`${JSON.stringify(m, replacer)}\n`);
  }

  /** Resolve once everything sent so far has been handed to the kernel (then exiting loses nothing). */
  flushed(): Promise<void> {
    if (this.#ended || this.socket.writableLength === 0) return Promise.resolve();
    return new Promise((r) => this.socket.write("", () => r()));
  }

  close(): void {
    this.socket.end();
  }
}

/** Rank 0's side: connect to the launcher's front at `path`. */
export function connectFront<In, Out>(path: string): Promise<LineChannel<In, Out>> {
  return new Promise((resolve, reject) => {
    const s = createConnection(path);
    s.once("connect", () => {
      s.off("error", reject);
      resolve(new LineChannel<In, Out>(s));
    });
    s.once("error", (e) => reject(new Error(`mlx-bun serve: could not reach the launcher's HTTP front at ${path}: ${e.message}`)));
  });
}
