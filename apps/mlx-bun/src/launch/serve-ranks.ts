// `mlx-bun serve` on rank 0 of a launched group (docs/distributed.md, serve across ranks): the
// HTTP front runs in a Worker (http-worker.ts); this thread runs the requests one at a time
// through the Engine, whose LeaderModel broadcasts every step to the follower ranks. A failed
// step means the group is broken: every open request gets a 500, and the process exits non-zero
// so the launcher stops the group. A hung peer blocks this thread; the worker notices the
// missing ticks and answers for it.
import type { Engine } from "@mlx-bun/runtime";
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

/** Serve until a signal (exit 0) or a failed step (exit 1). Returns the exit code. */
export async function serveOnRanks(o: RankServeOptions): Promise<number> {
  const worker = new Worker(new URL("./http-worker.ts", import.meta.url).href);
  const post = (m: ToWorker): void => worker.postMessage(m);
  const aborts = new Map<number, AbortController>();
  let finish!: (code: number) => void;
  const finished = new Promise<number>((r) => (finish = r));
  let closed!: () => void;
  const workerClosed = new Promise<void>((r) => (closed = r));
  let ending = false;

  /** Fail what is open in the worker, close it, then end with `code`. */
  const end = async (code: number, error: WireError): Promise<void> => {
    if (ending) return;
    ending = true;
    post({ t: "shutdown", error });
    await Promise.race([workerClosed, Bun.sleep(2000)]);
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
        // A step failed (e.g. "[ring] connection to a peer was lost"): the group cannot go on.
        const failed = new Error(`the tensor-parallel group failed: ${cause(e)}`);
        process.stderr.write(`mlx-bun serve: rank 0: ${failed.message}\n`);
        post({ t: "error", id, error: wire(failed, 500) });
        void end(1, wire(failed, 500));
      }
    } finally {
      aborts.delete(id);
    }
  };

  worker.onmessage = (e: MessageEvent<ToModel>) => {
    const m = e.data;
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
  worker.onerror = (e) => {
    process.stderr.write(`mlx-bun serve: the HTTP worker failed: ${e.message}\n`);
    void end(1, wire(new Error("the HTTP worker failed"), 500));
  };
  const tick = setInterval(() => post({ t: "tick" }), 250);
  const onSignal = () => void end(0, wire(new Error("the server is shutting down (the group is being stopped)"), 503));
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);
  const init: WorkerInit = { ...o.init, stallMs: stallMs(), maxKvSize: o.engine.maxKvSize };
  post({ t: "init", init });
  const code = await finished;
  clearInterval(tick);
  process.off("SIGINT", onSignal);
  process.off("SIGTERM", onSignal);
  worker.terminate();
  return code;
}
