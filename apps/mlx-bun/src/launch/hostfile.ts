// The host file of `mlx.launch` (mlx/_distributed_utils/common.py Hostfile): a JSON list of hosts,
// or {"backend", "envs", "hosts"}; each host {"ssh": name, "ips": [...], "rdma": [...]}.
import { readFileSync } from "node:fs";

export interface Host {
  rank: number;
  ssh: string;
  ips: string[];
}

export interface Hostfile {
  hosts: Host[];
  backend: string;
  envs: string[];
}

export class LaunchError extends Error {
  override name = "LaunchError";
}

/** Parse a host file; a malformed one is a LaunchError naming the file and the problem. */
export function readHostfile(path: string): Hostfile {
  let data: unknown;
  try {
    data = JSON.parse(readFileSync(path, "utf8"));
  } catch (e) {
    throw new LaunchError(`host file ${path}: ${(e as Error).message}`);
  }
  const obj = Array.isArray(data) ? { hosts: data } : data;
  if (!obj || typeof obj !== "object" || !Array.isArray((obj as { hosts?: unknown }).hosts)) {
    throw new LaunchError(`host file ${path}: expected a list of hosts or {"hosts": [...]}`);
  }
  const o = obj as { hosts: unknown[]; backend?: unknown; envs?: unknown };
  if (o.backend !== undefined && typeof o.backend !== "string") throw new LaunchError(`host file ${path}: "backend" must be a string`);
  if (o.envs !== undefined && !(Array.isArray(o.envs) && o.envs.every((e) => typeof e === "string")))
    throw new LaunchError(`host file ${path}: "envs" must be a list of strings`);
  const hosts = o.hosts.map((h, rank): Host => {
    if (!h || typeof h !== "object" || typeof (h as { ssh?: unknown }).ssh !== "string")
      throw new LaunchError(`host file ${path}: host ${rank} needs an "ssh" name`);
    const ips = (h as { ips?: unknown }).ips ?? [];
    if (!Array.isArray(ips) || !ips.every((i) => typeof i === "string"))
      throw new LaunchError(`host file ${path}: host ${rank} "ips" must be a list of strings`);
    return { rank, ssh: (h as { ssh: string }).ssh, ips: ips as string[] };
  });
  if (hosts.length === 0) throw new LaunchError(`host file ${path}: no hosts`);
  return { hosts, backend: (o.backend as string | undefined) ?? "", envs: (o.envs as string[] | undefined) ?? [] };
}

/** `-n N` on one machine: N ranks on loopback. */
export function localHosts(n: number): Hostfile {
  return { hosts: Array.from({ length: n }, (_, rank) => ({ rank, ssh: "127.0.0.1", ips: ["127.0.0.1"] })), backend: "", envs: [] };
}

const LOCAL = new Set(["127.0.0.1", "localhost", "::1"]);
export function isLocal(h: Host): boolean {
  return LOCAL.has(h.ssh);
}
