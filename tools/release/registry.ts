// A throwaway npm registry for the release check: Verdaccio (pinned in tools/setup/pins.json,
// installed from npm into .native/release/verdaccio on first use; run by Bun, since it wants
// Node >= 22) on a free loopback port, with its storage in a temporary folder. @mlx-bun/* and
// mlx-bun are served only from what is published to it; every other package is proxied from
// registry.npmjs.org.
//   bun tools/release/registry.ts        starts one and prints its URL and token until Ctrl-C
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { join } from "node:path";

const root = join(import.meta.dir, "..", "..");
const pins = JSON.parse(readFileSync(join(root, "tools/setup/pins.json"), "utf8")) as Record<string, string>;
const home = join(root, ".native/release/verdaccio");

export interface Registry {
  url: string;
  port: number;
  token: string;
  /** .npmrc lines that point npm and bun at this registry, with the publish token */
  npmrc: string;
  stop(): Promise<void>;
}

/** Install the pinned Verdaccio once (npm, like the set-up's Bun); returns its entry script. */
export function ensureVerdaccio(log: (s: string) => void = () => {}): string {
  const version = pins.verdaccio!;
  const bin = join(home, "node_modules/verdaccio/bin/verdaccio");
  const stamp = join(home, ".mlxb-stamp");
  if (existsSync(bin) && existsSync(stamp) && readFileSync(stamp, "utf8") === version) return bin;
  log(`installing verdaccio@${version} from npm into .native/release/verdaccio`);
  mkdirSync(home, { recursive: true });
  const p = Bun.spawnSync(["npm", "install", "--no-audit", "--no-fund", "--silent", "--prefix", home, `verdaccio@${version}`], {
    stdout: "inherit",
    stderr: "inherit",
  });
  if (p.exitCode !== 0 || !existsSync(bin)) throw new Error(`npm install verdaccio@${version} failed`);
  writeFileSync(stamp, version);
  return bin;
}

/** A free TCP port on 127.0.0.1. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

/** Start Verdaccio with its storage under `dir` (which the caller removes). */
export async function startRegistry(dir: string, log: (s: string) => void = () => {}): Promise<Registry> {
  const bin = ensureVerdaccio(log);
  mkdirSync(join(dir, "storage"), { recursive: true });
  const port = await freePort();
  const url = `http://127.0.0.1:${port}/`;
  const ours = (name: string) => `  '${name}':\n    access: $all\n    publish: $authenticated\n    unpublish: $authenticated\n`;
  writeFileSync(
    join(dir, "config.yaml"),
    [
      `storage: ${join(dir, "storage")}`,
      "auth:",
      "  htpasswd:",
      `    file: ${join(dir, "htpasswd")}`,
      "    max_users: 100",
      "uplinks:",
      "  npmjs:",
      "    url: https://registry.npmjs.org/",
      "    timeout: 60s",
      "packages:",
      ours("@mlx-bun/*") + ours("mlx-bun") + "  '**':\n    access: $all\n    proxy: npmjs",
      // The CUDA package is ~160 MB unpacked; npm sends a tarball base64-encoded in JSON.
      "max_body_size: 1000mb",
      `listen: 127.0.0.1:${port}`,
      "log: { type: stdout, format: pretty, level: warn }",
      "web:",
      "  enable: false",
      "",
    ].join("\n"),
  );
  const logFile = Bun.file(join(dir, "verdaccio.log"));
  const proc = Bun.spawn([process.execPath, bin, "--config", join(dir, "config.yaml")], { stdout: logFile, stderr: logFile, cwd: dir });
  const deadline = Date.now() + 30_000;
  for (;;) {
    try {
      const r = await fetch(`${url}-/ping`);
      if (r.ok) break;
    } catch {
      // not up yet
    }
    if (proc.exitCode !== null || Date.now() > deadline) {
      proc.kill();
      throw new Error(
        `verdaccio did not start on ${url}:\n${existsSync(join(dir, "verdaccio.log")) ? readFileSync(join(dir, "verdaccio.log"), "utf8").slice(-2000) : ""}`,
      );
    }
    await Bun.sleep(100);
  }
  // A user for publishing (npm adduser's request), whose token goes into the publisher's .npmrc.
  const user = { name: "release-check", password: crypto.randomUUID() };
  const r = await fetch(`${url}-/user/org.couchdb.user:${user.name}`, {
    method: "PUT",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ _id: `org.couchdb.user:${user.name}`, type: "user", roles: [], ...user }),
  });
  const body = (await r.json()) as { token?: string; error?: string };
  if (!body.token) {
    proc.kill();
    throw new Error(`verdaccio gave no token: ${JSON.stringify(body)}`);
  }
  const hostPath = url.replace(/^http:/, "");
  return {
    url,
    port,
    token: body.token,
    npmrc: `registry=${url}\n${hostPath}:_authToken=${body.token}\n`,
    async stop() {
      proc.kill();
      await proc.exited;
    },
  };
}

if (import.meta.main) {
  const dir = join(process.env.TMPDIR ?? "/tmp", `mlx-bun-registry-${process.pid}`);
  const reg = await startRegistry(dir, console.log);
  console.log(`registry ${reg.url} (storage ${dir})\n${reg.npmrc}`);
  process.on("SIGINT", () => reg.stop().then(() => process.exit(0)));
}
