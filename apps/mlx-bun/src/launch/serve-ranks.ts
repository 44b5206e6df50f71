// `mlx-bun serve` on rank 0 of a launched group (docs/distributed.md, serve across ranks): this
// thread runs the requests one at a time through the Engine, whose LeaderModel broadcasts every
// step to the follower ranks; the HTTP front lives elsewhere (serve-front.ts): in the launcher,
// reached over a socket (serve-channel.ts), or, when rank 0 is not a local child of the launcher,
// in a Worker of this process (http-worker.ts). A failed step means the group is broken: every
// open request gets a 500 and the process exits 1 at once (it touches the broken group no more),
// so the launcher stops the group.
import type { Engine } from "@mlx-bun/runtime";
import { connectFront, SERVE_FRONT_ENV } from "./serve-channel.ts";
import type { ToModel, ToWorker, WireError, WorkerInit } from "./serve-protocol.ts";

export interface RankServeOptions {
  engine: Engine;
  init: Omit<WorkerInit, "stallMs" | "maxKvSize">;
  /** The listening line serve prints, given the URL and the web chat state. */
  announce: (url: string, webChat: "on" | "not built" | "off") => void;
}

/** An eval error's message names every array it evaluated; keep the cause after the list. */
function cause(e: unknown): string {
  const m = (e as Error)?.message ?? String(e);
  return /^(async_)?eval\(/.test(m) && m.includes("): ") ? m.slice(m.lastIndexOf("): ") + 3) : m;
}

const wire = (e: unknown, status?: number): WireError => ({
  name: (e as Error)?.name ?? "Error",
  message: (e as Error)?.message ?? String(e),
  ...(status !== undefined ? { status } : {}),
});

/** The launcher's rank timeout (MLX_BUN_LAUNCH_TIMEOUT_MS, default 30 s): the worker's stall limit too. */
export function stallMs(): number {
  const t = Number(process.env.MLX_BUN_LAUNCH_TIMEOUT_MS);
  return Number.isFinite(t) && t > 0 ? t : 30_000;
}

/** Where the front is: the messages go out with `post`, come in through `onMessage`; `ended` when it is gone. */
interface FrontLink {
  post(m: ToWorker): void;
  onMessage: (m: ToModel) => void;
  onEnd: (why: string) => void;
  /** Everything posted so far has left this process. */
  flushed(): Promise<void>;
  /** The front watches ticks (the Worker: nobody else may be watching this process). */
  wantsTicks: boolean;
  close(): void;
}

function workerLink(): FrontLink {
  const worker = new Worker(new URL("./http-worker.ts", import.meta.url).href);
  const link: FrontLink = {
    post: (m) => worker.postMessage(m),
    onMessage: () => {},
    onEnd: () => {},
    flushed: () => Promise.resolve(),
    wantsTicks: true,
    close: () => worker.terminate(),
  };
  worker.onmessage = (e: MessageEvent<ToModel>) => link.onMessage(e.data);
  worker.onerror = (e) => link.onEnd(`the HTTP worker failed: ${e.message}`);
  return link;
}

async function socketLink(path: string): Promise<FrontLink> {
  const ch = await connectFront<ToModel, ToWorker>(path);
  const link: FrontLink = {
    post: (m) => ch.send(m),
    onMessage: () => {},
    onEnd: () => {},
    flushed: () => ch.flushed(),
    wantsTicks: false,
    close: () => ch.close(),
  };
  ch.onMessage = (m) => link.onMessage(m);
  ch.onEnd = (why) => link.onEnd(`the launcher's HTTP front is gone (${why})`);
  return link;
}

/** Serve until a signal (exit 0) or a failed step (exit 1). Returns the exit code. */
export async function serveOnRanks(o: RankServeOptions): Promise<number> {
  const frontPath = process.env[SERVE_FRONT_ENV];
  const link = frontPath ? await socketLink(frontPath) : workerLink();
  const post = link.post;
  const aborts = new Map<number, AbortController>();
  let finish!: (code: number) => void;
  const finished = new Promise<number>((r) => (finish = r));
  let closed!: () => void;
  const frontClosed = new Promise<void>((r) => (closed = r));
  let ending = false;

  /** Fail what is open in the front, wait for it to close, then end with `code`. */
  const end = async (code: number, error: WireError): Promise<void> => {
    if (ending) return;
    ending = true;
    post({ t: "shutdown", error });
    await Promise.race([frontClosed, Bun.sleep(2000)]);
    finish(code);
  };

  const run = async (id: number, req: ToModel & { t: "submit" }): Promise<void> => {
    const ac = new AbortController();
    aborts.set(id, ac);
    try {
      let stream;
      try {
        stream = o.engine.generate({ ...req.req, signal: ac.signal });
      } catch (e) {
        // A request the engine refuses (RequestError): that request's error only.
        post({ t: "error", id, error: wire(e) });
        return;
      }
      try {
        for await (const ev of stream) post({ t: "event", id, ev });
        post({ t: "done", id, result: await stream.result });
      } catch (e) {
        // A step failed (e.g. "[ring] connection to a peer was lost"): the group cannot go on. Report
        // it and leave now: the LeaderModel's keep-alive or any cleanup would issue collectives on
        // the broken group, and nothing this process still holds needs an orderly release.
        const failed = new Error(`the tensor-parallel group failed: ${cause(e)}`);
        process.stderr.write(`mlx-bun serve: rank 0: ${failed.message}\n`);
        post({ t: "error", id, error: wire(failed, 500) });
        ending = true;
        post({ t: "shutdown", error: wire(failed, 500) });
        await Promise.race([frontClosed, link.wantsTicks ? Bun.sleep(2000) : link.flushed()]);
        process.exit(1);
      }
    } finally {
      aborts.delete(id);
    }
  };

  link.onMessage = (m) => {
    if (m.t === "listening") o.announce(m.url, m.webChat);
    else if (m.t === "startFailed") {
      process.stderr.write(`mlx-bun serve: the HTTP server did not start: ${m.error.message}\n`);
      finish(1);
    } else if (m.t === "submit") {
      if (ending) post({ t: "error", id: m.id, error: wire(new Error("the server is shutting down"), 503) });
      else void run(m.id, m);
    } else if (m.t === "cancel") aborts.get(m.id)?.abort();
    else if (m.t === "closed") closed();
  };
  link.onEnd = (why) => {
    closed();
    if (ending) return;
    process.stderr.write(`mlx-bun serve: ${why}\n`);
    ending = true;
    finish(1);
  };
  const tick = link.wantsTicks ? setInterval(() => post({ t: "tick" }), 250) : undefined;
  const onSignal = () => void end(0, wire(new Error("the server is shutting down (the group is being stopped)"), 503));
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);
  const init: WorkerInit = { ...o.init, stallMs: stallMs(), maxKvSize: o.engine.maxKvSize };
  post({ t: "init", init });
  const code = await finished;
  if (tick) clearInterval(tick);
  process.off("SIGINT", onSignal);
  process.off("SIGTERM", onSignal);
  link.close();
  return code;
}
