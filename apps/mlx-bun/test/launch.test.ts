// `mlx-bun launch`: tensor-parallel generate over the ring backend on loopback, and the group
// stopping with a clear report when a rank dies or hangs mid-generation.
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { BUN, CLI, makeTinySmall, ROOT, runCli, tempDir } from "./helpers.ts";

let dir: ReturnType<typeof tempDir>;
let model: string;
let tiny2: string;
beforeAll(() => {
  dir = tempDir("mlxb-launch-");
  model = makeTinySmall(`${dir.path}/small6`, ["--set", "num_attention_heads=6", "--set", "num_key_value_heads=6", "--set", "intermediate_size=192"]);
  tiny2 = makeTinySmall(`${dir.path}/small2`);
});
afterAll(() => dir.cleanup());

const GEN = ["generate", "--json", "--ignore-chat-template", "--prompt", "hello there", "--max-tokens", "24"];

/** Start `mlx-bun launch ...`; resolve with the rank pids it reports and the process. */
function startLaunch(args: string[]) {
  const p = Bun.spawn([BUN, CLI, "launch", ...args], { cwd: ROOT, env: { ...process.env, NO_COLOR: "1" }, stdout: "pipe", stderr: "pipe" });
  let stderr = "";
  const pids = new Map<number, number>();
  const err = (async () => {
    const dec = new TextDecoder();
    for await (const chunk of p.stderr) {
      stderr += dec.decode(chunk);
      for (const m of stderr.matchAll(/rank (\d+) on \S+ pid (\d+)/g)) pids.set(Number(m[1]), Number(m[2]));
    }
  })();
  let stdout = "";
  const out = (async () => {
    const dec = new TextDecoder();
    for await (const chunk of p.stdout) stdout += dec.decode(chunk);
  })();
  return {
    p,
    pids,
    get stdout() {
      return stdout;
    },
    get stderr() {
      return stderr;
    },
    done: Promise.all([p.exited, err, out]).then(([code]) => code),
  };
}

describe("mlx-bun launch", () => {
  test("generate on 2 and 3 ranks gives the single-process greedy tokens", async () => {
    const single = await runCli([...GEN, "--model", model]);
    expect(single.code, single.stderr).toBe(0);
    const want = JSON.parse(single.stdout).generated_ids as number[];
    expect(want.length).toBe(24);
    for (const n of ["2", "3"]) {
      const bf = await runCli(["launch", "-n", n, "--", ...GEN, "--model", model]);
      expect(bf.code, bf.stderr).toBe(0);
      expect(JSON.parse(bf.stdout.trim().split("\n").at(-1)!).generated_ids, `${n} ranks`).toEqual(want);
    }
  });

  test("heads that do not divide by the group size are a clear error, and the group stops", async () => {
    const r = await runCli(["launch", "-n", "3", "--timeout", "10", "--", ...GEN, "--model", tiny2]);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/tensor parallel: layer 0 has 2 attention heads, which do not divide by the group size 3/);
    expect(r.stderr).toMatch(/mlx-bun launch: rank \d exited with code 1; stopping the group/);
  });

  for (const [how, signal, timeout] of [
    ["killed", "SIGKILL", "20"],
    ["stopped (hung)", "SIGSTOP", "3"],
  ] as const) {
    test(`a follower ${how} mid-generation ends the group with a clear error within the timeout`, async () => {
      const run = startLaunch(["-n", "2", "--timeout", timeout, "--", "generate", "--model", model, "--ignore-chat-template", "--prompt", "hi", "--max-tokens", "3000", "--no-verbose"]);
      // Wait until rank 0 streams text, then take rank 1 down.
      const t0 = Date.now();
      while (run.stdout.length < 200 && Date.now() - t0 < 30_000) await Bun.sleep(20);
      expect(run.stdout.length).toBeGreaterThanOrEqual(200);
      const pid = run.pids.get(1)!;
      const killedAt = Date.now();
      process.kill(pid, signal);
      const code = await run.done;
      const took = (Date.now() - killedAt) / 1000;
      if (signal === "SIGSTOP") {
        try {
          process.kill(pid, "SIGKILL");
        } catch {
          // already gone
        }
      }
      expect(code).toBe(1);
      if (signal === "SIGKILL") expect(run.stderr).toMatch(/rank 1 was killed by SIGKILL; stopping the group|rank 0 exited with code 1; stopping the group/);
      else expect(run.stderr).toMatch(/rank 1 sent no heartbeat for 3 s \(process stopped\); ranks 0 waited on it; stopping the group/);
      // The stated bound: the rank timeout plus the launcher's 2 s kill grace and a little slack.
      expect(took).toBeLessThan(Number(timeout) + 4);
    });
  }
});
