// `mlx-bun launch`: start one process per rank the way `mlx.launch` does (the ring backend's
// MLX_HOSTFILE with one ip:port per rank, MLX_RANK; NCCL's NCCL_HOST_IP / NCCL_PORT /
// MLX_WORLD_SIZE), then watch them: a rank that exits with an error, or sends no heartbeat for
// `timeoutMs`, stops the whole group, and the report names the rank and why (docs/distributed.md).
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type Hostfile, isLocal, LaunchError } from "./hostfile.ts";
import { SERVE_FRONT_ENV } from "./serve-channel.ts";
import type { ServeFront } from "./serve-front.ts";
import type { ToModel, ToWorker } from "./serve-protocol.ts";

export type LaunchBackend = "ring" | "nccl" | "any";

export interface LaunchOptions {
  hosts: Hostfile;
  backend: LaunchBackend;
  /** The command every rank runs (argv). */
  command: string[];
  /** A rank silent for this long stops the group (default 30 s). */
  timeoutMs?: number;
  /** First port of the ring backend; 0 (default for local runs) picks free ports. */
  startingPort?: number;
  ncclPort?: number;
  env?: string[];
  /** Where the report lines go (default stderr). */
  log?: (line: string) => void;
  /**
   * The command is `serve`: the launcher runs its HTTP front (serve-front.ts) and rank 0 reaches it
   * over a local socket, so open requests are answered even when rank 0's process dies. Local
   * rank 0 only; a remote rank 0 keeps its front in a Worker of its own (docs/distributed.md).
   */
  serveFront?: boolean;
}

export interface LaunchResult {
  /** The exit code the launcher should return: rank 0's, or 1 when the group failed. */
  code: number;
  /** Why the group was stopped, or null when every rank ended cleanly. */
  failure: string | null;
}

/** The file descriptor a rank writes heartbeats to (set in MLX_BUN_HEARTBEAT_FD). */
export const HEARTBEAT_FD = 3;
/** The file descriptor a rank may read the launcher's stop notice from ("stop <why>\n", set in MLX_BUN_CONTROL_FD). */
export const CONTROL_FD = 4;

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const a = s.address();
      s.close(() => resolve(typeof a === "object" && a ? a.port : 0));
    });
  });
}

function shellQuote(s: string): string {
  return `'${s.replace(/'/g, `'\\''`)}'`;
}

/** Process state letter from /proc (Linux): "T" = stopped, "D" = uninterruptible; null elsewhere. */
function procState(pid: number | undefined): string | null {
  if (pid === undefined) return null;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0] ?? null;
  } catch {
    return null;
  }
}

/** Start the ranks and watch them until all have ended or the group is stopped. */
export async function launch(o: LaunchOptions): Promise<LaunchResult> {
  const log = o.log ?? ((l: string) => process.stderr.write(`${l}\n`));
  const timeoutMs = o.timeoutMs ?? 30_000;
  const hosts = o.hosts.hosts;
  const n = hosts.length;
  const backend = o.backend === "any" ? o.hosts.backend || "ring" : o.backend;
  if (backend !== "ring" && backend !== "nccl") throw new LaunchError(`launch: backend ${JSON.stringify(backend)} is not supported (ring | nccl | any)`);
  if (o.command.length === 0) throw new LaunchError("launch: no command to run");
  const tmp = mkdtempSync(join(tmpdir(), "mlxb-launch-"));
  const env: Record<string, string> = {};
  for (const e of [...o.hosts.envs, ...(o.env ?? [])]) {
    const i = e.indexOf("=");
    const k = i < 0 ? e : e.slice(0, i);
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(k)) throw new LaunchError(`launch: ${JSON.stringify(e)} is not a valid environment variable`);
    env[k] = i < 0 ? "" : e.slice(i + 1);
  }
  env.MLX_BUN_DIST_BACKEND = backend;
  env.MLX_BUN_HEARTBEAT_FD = String(HEARTBEAT_FD);
  // serve's HTTP worker on rank 0 answers open requests just before the launcher's watchdog fires.
  env.MLX_BUN_LAUNCH_TIMEOUT_MS = String(timeoutMs);
  env.MLX_BUN_CONTROL_FD = String(CONTROL_FD);
  if (backend === "ring") {
    if (hosts.some((h) => h.ips.length === 0)) throw new LaunchError('launch: the ring backend needs IPs in the host file ("ips") for every host');
    const ring: string[][] = [];
    let port = o.startingPort ?? 0;
    for (const h of hosts) ring.push([`${h.ips[0]}:${port > 0 ? port++ : await freePort()}`]);
    // mlx.launch leaves MLX_HOSTFILE empty for a single rank.
    if (n > 1) {
      const file = join(tmp, "ring.json");
      writeFileSync(file, JSON.stringify(ring));
      env.MLX_HOSTFILE = file;
      env.MLX_BUN_RING = JSON.stringify(ring);
    }
  } else {
    if (!hosts[0]!.ips[0]) throw new LaunchError("launch: NCCL needs an IP for rank 0 in the host file");
    env.NCCL_HOST_IP = hosts[0]!.ips[0];
    env.NCCL_PORT = String(o.ncclPort ?? (isLocal(hosts[0]!) ? await freePort() : 12345));
    env.MLX_WORLD_SIZE = String(n);
  }

  // serve: the HTTP front lives here, the one process of the group that runs no MLX collective.
  let front: ServeFront | null = null;
  let frontServer: Server | null = null;
  const frontPath = join(tmp, "front.sock");
  if (o.serveFront && isLocal(hosts[0]!))
    frontServer = await startFrontSocket(
      frontPath,
      (f) => (front = f),
      (why) => frontLost(why),
    );

  const children: ChildProcess[] = [];
  const lastBeat: number[] = hosts.map(() => Date.now());
  const exited: (number | string | null)[] = hosts.map(() => null);
  let failure: string | null = null;
  let stopping = false;
  let finish!: () => void;
  const allDone = new Promise<void>((r) => (finish = r));

  const stopAll = (why: string): void => {
    if (stopping) return;
    stopping = true;
    failure = why;
    log(`mlx-bun launch: ${why}; stopping the group`);
    // Every open request gets its answer now, whatever state rank 0 is in (hung, dead, crashed).
    (front as ServeFront | null)?.goDown(503, `the tensor-parallel group is being stopped: ${why}`);
    for (const c of children) {
      if (c.exitCode !== null || c.signalCode !== null) continue;
      // Read by a thread the hang does not block (serve's HTTP worker), so open requests get an answer naming the cause.
      const ctl = c.stdio[CONTROL_FD] as NodeJS.WritableStream | null | undefined;
      try {
        ctl?.write(`stop ${why}\n`);
      } catch {
        // the rank is gone
      }
      c.kill("SIGTERM");
    }
    // A rank stuck in a collective (or stopped) may not take SIGTERM: make sure.
    setTimeout(() => {
      for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
    }, 2000).unref();
  };

  /** Rank 0's end of the serve channel closed: its exit (which names the cause) normally follows at once. */
  const frontLost = (why: string): void => {
    setTimeout(() => {
      if (!stopping && exited[0] === null) stopAll(`rank 0 closed its serve channel (${why})`);
    }, 1000).unref();
  };

  for (const h of hosts) {
    const rankEnv: Record<string, string> = { ...env, MLX_RANK: String(h.rank) };
    if (frontServer && h.rank === 0) rankEnv[SERVE_FRONT_ENV] = frontPath;
    if (backend === "nccl") rankEnv.CUDA_VISIBLE_DEVICES = String(h.rank % Math.max(1, hosts.filter((x) => x.ssh === h.ssh).length));
    let child: ChildProcess;
    const stdio: ("inherit" | "pipe" | "ignore")[] = ["ignore", "inherit", "inherit", "pipe", "pipe"];
    if (isLocal(h)) {
      if (rankEnv.MLX_HOSTFILE === undefined) delete rankEnv.MLX_HOSTFILE;
      child = spawn(o.command[0]!, o.command.slice(1), { env: { ...process.env, ...rankEnv }, stdio });
    } else {
      // Over ssh (as mlx.launch): the ring host list travels in the script. No heartbeat channel
      // crosses ssh, so a remote rank is watched by its exit only (docs/distributed.md).
      const exports = Object.entries(rankEnv)
        .filter(([k]) => k !== "MLX_HOSTFILE" && k !== "MLX_BUN_HEARTBEAT_FD" && k !== "MLX_BUN_CONTROL_FD")
        .map(([k, v]) => `export ${k}=${shellQuote(v)};`)
        .join(" ");
      const ringFile = env.MLX_BUN_RING ? `f=$(mktemp); echo ${shellQuote(env.MLX_BUN_RING)} > $f; export MLX_HOSTFILE=$f;` : "";
      const script = `cd ${shellQuote(process.cwd())} 2>/dev/null; ${exports} ${ringFile} exec ${o.command.map(shellQuote).join(" ")}`;
      child = spawn("ssh", [h.ssh, script], { env: process.env, stdio: ["ignore", "inherit", "inherit"] });
    }
    children.push(child);
    log(`mlx-bun launch: rank ${h.rank} on ${h.ssh} pid ${child.pid ?? "?"}`);
    child.stdio[3]?.on("data", () => (lastBeat[h.rank] = Date.now()));
    (child.stdio[CONTROL_FD] as NodeJS.WritableStream | null | undefined)?.on("error", () => {});
    child.on("error", (e) => stopAll(`rank ${h.rank} could not start: ${e.message}`));
    child.on("exit", (code, signal) => {
      exited[h.rank] = signal ?? code ?? -1;
      if (!stopping && (signal || code !== 0)) stopAll(`rank ${h.rank} ${signal ? `was killed by ${signal}` : `exited with code ${code}`}`);
      if (!stopping && h.rank === 0) {
        // Rank 0 ended cleanly: the others should follow its stop message within the timeout.
        setTimeout(() => {
          const left = exited.map((e, r) => (e === null ? r : -1)).filter((r) => r >= 0);
          if (left.length) stopAll(`rank 0 finished but rank${left.length > 1 ? "s" : ""} ${left.join(", ")} did not exit within ${timeoutMs / 1000} s`);
        }, timeoutMs).unref();
      }
      if (exited.every((e) => e !== null)) finish();
    });
  }

  // Stopping the launcher stops the group: no rank outlives it.
  const onSignal = (sig: NodeJS.Signals) => stopAll(`the launcher got ${sig}`);
  process.on("SIGINT", onSignal);
  process.on("SIGTERM", onSignal);
  const watchdog = setInterval(
    () => {
      if (stopping) return;
      const now = Date.now();
      const silent = hosts.filter((h) => isLocal(h) && exited[h.rank] === null && now - lastBeat[h.rank]! > timeoutMs);
      if (!silent.length) return;
      // A stopped rank stalls the others' collectives, and the first to pass the timeout may be one
      // that waits on it (rank 0 beats on a timer, followers on every step): name any stopped rank.
      const stopped = hosts.filter((h) => isLocal(h) && exited[h.rank] === null && procState(children[h.rank]!.pid) === "T");
      const named = (stopped.length ? stopped : silent).map((h) => h.rank);
      stopAll(
        `rank${named.length > 1 ? "s" : ""} ${named.join(", ")} sent no heartbeat for ${timeoutMs / 1000} s${stopped.length ? " (process stopped)" : ""}` +
          (stopped.length && silent.some((h) => !stopped.includes(h))
            ? `; ranks ${silent
                .filter((h) => !stopped.includes(h))
                .map((h) => h.rank)
                .join(", ")} waited on it`
            : ""),
      );
    },
    Math.min(1000, Math.max(50, timeoutMs / 4)),
  );
  watchdog.unref();
  try {
    await allDone;
    const f = front as ServeFront | null;
    if (f) {
      f.goDown(503, "the tensor-parallel group has ended");
      // The error events written just now go out before the listener closes its connections.
      await Bun.sleep(100);
      await f.stop();
    }
  } finally {
    frontServer?.close();
    clearInterval(watchdog);
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
    rmSync(tmp, { recursive: true, force: true });
  }
  const c0 = exited[0];
  return { code: failure ? 1 : typeof c0 === "number" ? c0 : 1, failure };
}

/** Listen on `path` for rank 0's serve channel; one connection, which gets a ServeFront. */
async function startFrontSocket(path: string, onFront: (f: ServeFront) => void, onLost: (why: string) => void): Promise<Server> {
  const [{ ServeFront }, { LineChannel }] = await Promise.all([import("./serve-front.ts"), import("./serve-channel.ts")]);
  let taken = false;
  const srv = createServer((sock) => {
    // rank 0 only: no second connection
    if (taken) return void sock.destroy();
    taken = true;
    const ch = new LineChannel<ToWorker, ToModel>(sock);
    const front = new ServeFront((m) => ch.send(m));
    ch.onMessage = (m) => void front.receive(m);
    ch.onEnd = (why) => onLost(why);
    onFront(front);
  });
  await new Promise<void>((resolve, reject) => {
    srv.once("error", reject);
    srv.listen(path, () => {
      srv.off("error", reject);
      resolve();
    });
  });
  return srv;
}
