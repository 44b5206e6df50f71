// The HTTP front (serve-front.ts) in a Bun Worker of rank 0, for a rank 0 the launcher does not
// front itself (a remote rank 0 of a --hostfile run, or serve started with MLX_BUN_DIST_BACKEND by
// hand). Its thread keeps answering while the model thread is blocked in a collective: when the
// model thread sends no tick for `stallMs`, or the launcher's stop notice arrives on
// MLX_BUN_CONTROL_FD, every open request fails with a 503. It dies with the process, so a rank 0
// that crashes leaves its clients with a reset: the launcher's front has no such gap (docs/distributed.md).
import { ServeFront } from "./serve-front.ts";
import type { ToModel, ToWorker, WorkerInit } from "./serve-protocol.ts";

declare const self: Worker;
const front = new ServeFront((m: ToModel) => self.postMessage(m));
let lastTick = Date.now();

function watch(init: WorkerInit): void {
  void readControl();
  const t = setInterval(
    () => {
      if (front.isDown || Date.now() - lastTick <= init.stallMs) return;
      front.goDown(
        503,
        `the tensor-parallel group stopped responding: rank 0 made no progress for ${(init.stallMs / 1000).toFixed(1)} s (a rank died or hung); the group is being stopped`,
      );
      // Under `mlx-bun launch` the launcher stops the group now; a rank 0 nobody watches ends itself.
      setTimeout(() => process.kill(process.pid, "SIGKILL"), init.stallMs + 5000).unref();
    },
    Math.min(250, init.stallMs / 4),
  );
  t.unref();
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
      if (line) front.goDown(503, `the tensor-parallel group is being stopped: ${line.slice(5)}`);
    }
  } catch {
    // no control channel (not started by the launcher)
  }
}

self.onmessage = (e: MessageEvent<ToWorker>) => {
  const m = e.data;
  lastTick = Date.now();
  if (m.t === "init") {
    front.start(m.init);
    if (front.url) watch(m.init);
    return;
  }
  void front.receive(m);
};
