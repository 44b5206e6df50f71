import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { freePort } from "../../../tools/oracle/ports.ts";
import { MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";

const WORKER = join(import.meta.dirname, "distributed-worker.ts");

type Out = Record<string, any>;
/** Run n ranks of the worker over the ring backend on loopback (what `mlx.launch -n` sets up). */
async function runRing(n: number): Promise<Out[]> {
  const dir = mkdtempSync(join(tmpdir(), "mlxb-ring-"));
  try {
    const hosts: string[][] = [];
    for (let i = 0; i < n; i++) hosts.push([`127.0.0.1:${await freePort()}`]);
    const hostfile = join(dir, "hosts.json");
    writeFileSync(hostfile, JSON.stringify(hosts));
    const runs = hosts.map(
      (_, rank) =>
        new Promise<Out>((resolve, reject) => {
          const p = spawn(process.execPath, [WORKER], {
            env: { ...process.env, MLX_HOSTFILE: hostfile, MLX_RANK: String(rank) },
            stdio: ["ignore", "pipe", "pipe"],
          });
          let so = "";
          let se = "";
          p.stdout.on("data", (d) => (so += d));
          p.stderr.on("data", (d) => (se += d));
          const t = setTimeout(() => p.kill("SIGKILL"), 60_000);
          p.on("exit", (code) => {
            clearTimeout(t);
            if (code === 0) resolve(JSON.parse(so.trim().split("\n").at(-1)!));
            else reject(new Error(`rank ${rank} exited ${code}: ${se}`));
          });
        }),
    );
    return await Promise.all(runs);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

describe("mx.distributed over the ring backend", () => {
  test("the ring backend is built in; size-1 group without a launcher", () => {
    expect(mx.distributed.is_available("ring")).toBe(true);
    expect(mx.distributed.is_available()).toBe(true);
    using g = mx.distributed.init();
    expect([g.rank(), g.size()]).toEqual([0, 1]);
    using x = MlxArray.fromNumbers([1, 2], [2], "float32");
    using y = mx.distributed.all_sum(x, { group: g });
    expect(y.tolist()).toEqual([1, 2]);
    expect(() => mx.distributed.init({ backend: "tcp" as never })).toThrow(/unknown backend "tcp"/);
  });

  for (const n of [2, 3]) {
    test(`${n} ranks: all_sum, all_gather, all_max/min, send/recv against closed forms`, async () => {
      const outs = await runRing(n);
      const tri = (n * (n + 1)) / 2;
      const ranksSum = (n * (n - 1)) / 2;
      for (const [r, o] of outs.entries()) {
        expect(o.rank).toBe(r);
        expect(o.size).toBe(n);
        expect(o.sumF32).toEqual([tri, 2 * tri, 3 * tri]);
        expect(o.sumBf16).toEqual([tri, 2 * tri]);
        expect(o.sumI32).toEqual([ranksSum, 10 * ranksSum]);
        expect(o.gather).toEqual(Array.from({ length: n }, (_, i) => [i, i]).flat());
        expect(o.max).toEqual([n - 1, 0]);
        expect(o.min).toEqual([0, -(n - 1)]);
        const src = (r + n - 1) % n;
        expect(o.recv).toEqual([src, src * src]);
        expect(o.splitRing).toMatch(/distributed\.Group\.split\(color=\d, key=-1\): \[ring\] Group split not supported/);
        expect(o.afterSplit).toEqual([ranksSum]);
        expect(o.badSend).toMatch(new RegExp(`destination rank ${n} is outside the group \\(size ${n}\\)`));
        expect(o.selfSend).toMatch(/own rank/);
        expect(o.badRecv).toMatch(/source rank -1 is outside the group/);
        expect(o.badSplit).toMatch(/color must be >= 0/);
        expect(o.leak).toBe(0);
      }
    });
  }
});
