// mlx-bun launch: run a command on every rank of a group, as `mlx.launch` (-n local processes
// or a --hostfile), and stop the whole group when one rank fails or goes silent.
import { fileURLToPath } from "node:url";
import { launch, type LaunchBackend } from "../launch/launcher.ts";
import { type Hostfile, LaunchError, localHosts, readHostfile } from "../launch/hostfile.ts";

export interface LaunchCliOptions {
  n?: number;
  hostfile?: string;
  backend: string;
  timeout: number;
  startingPort?: number;
  ncclPort?: number;
  env?: string[];
}

const SUBCOMMANDS = new Set(["generate", "serve", "chat"]);

export async function runLaunch(command: string[], o: LaunchCliOptions): Promise<number> {
  if (o.n !== undefined && o.hostfile) throw new LaunchError("launch: give -n or --hostfile, not both");
  const hosts: Hostfile = o.hostfile ? readHostfile(o.hostfile) : localHosts(o.n ?? 1);
  let backend = o.backend as LaunchBackend;
  if (!["ring", "nccl", "any"].includes(backend)) throw new LaunchError(`launch: --backend must be ring, nccl or any, got ${JSON.stringify(o.backend)}`);
  if (backend === "any" && !hosts.backend) {
    // As mlx.launch: NCCL where CUDA is live, the ring backend otherwise.
    const { backendAvailable } = await import("@mlx-bun/runtime");
    const { isDeviceAvailable } = await import("@mlx-bun/mlx-ffi");
    backend = backendAvailable("nccl") && isDeviceAvailable("gpu") ? "nccl" : "ring";
  }
  // `mlx-bun launch -n 2 generate ...` runs this same CLI on every rank.
  const argv = SUBCOMMANDS.has(command[0]!) ? [process.execPath, fileURLToPath(new URL("../cli.ts", import.meta.url)), ...command] : command;
  const r = await launch({
    hosts,
    backend,
    command: argv,
    timeoutMs: o.timeout * 1000,
    ...(o.startingPort !== undefined ? { startingPort: o.startingPort } : {}),
    ...(o.ncclPort !== undefined ? { ncclPort: o.ncclPort } : {}),
    ...(o.env ? { env: o.env } : {}),
    serveFront: command[0] === "serve",
  });
  return r.code;
}
