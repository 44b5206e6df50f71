// `mlx-bun launch`: tensor-parallel generate and serve over the ring backend on loopback, and the
// group stopping with a clear report (and a clear error to the HTTP client) when a rank dies or
// hangs mid-generation.
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { BUN, CLI, makeTinySmall, ROOT, runCli, tempDir } from "./helpers.ts";

let dir: ReturnType<typeof tempDir>;
let model: string;
beforeAll(() => {
  dir = tempDir("mlxb-launch-");
  model = makeTinySmall(`${dir.path}/small6`, ["--set", "num_attention_heads=6", "--set", "num_key_value_heads=6", "--set", "intermediate_size=192"]);
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

/** Wait for serve's listening line; its URL. */
async function listening(run: ReturnType<typeof startLaunch>): Promise<string> {
  const t0 = Date.now();
  for (;;) {
    const m = run.stderr.match(/listening on (http:\/\/\S+)/);
    if (m) return m[1]!;
    if (Date.now() - t0 > 30_000) throw new Error(`serve did not start: ${run.stderr}`);
    await Bun.sleep(20);
  }
}

describe("mlx-bun launch", () => {
  // 3 ranks and every variant: packages/runtime/test/distributed.test.ts (here: the CLI path).
  test("generate on 2 ranks gives the single-process greedy tokens", async () => {
    const single = await runCli([...GEN, "--model", model]);
    expect(single.code, single.stderr).toBe(0);
    const want = JSON.parse(single.stdout).generated_ids as number[];
    expect(want.length).toBe(24);
    for (const n of ["2"]) {
      const bf = await runCli(["launch", "-n", n, "--", ...GEN, "--model", model]);
      expect(bf.code, bf.stderr).toBe(0);
      expect(JSON.parse(bf.stdout.trim().split("\n").at(-1)!).generated_ids, `${n} ranks`).toEqual(want);
    }
  });

  test("heads that do not divide by the group size are a clear error, and the group stops", async () => {
    const r = await runCli(["launch", "-n", "4", "--timeout", "10", "--", ...GEN, "--model", model]);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/tensor parallel: layer 0 has 6 attention heads, which do not divide by the group size 4/);
    expect(r.stderr).toMatch(/mlx-bun launch: rank \d exited with code 1; stopping the group/);
  });

  test("serve on 2 ranks answers with the single-process greedy tokens", async () => {
    const single = await runCli([...GEN, "--model", model]);
    expect(single.code, single.stderr).toBe(0);
    const want = JSON.parse(single.stdout) as { prompt_ids: number[]; generated_ids: number[] };
    const run = startLaunch(["-n", "2", "--timeout", "20", "--", "serve", "--model", model, "--port", "0", "--no-web"]);
    try {
      const url = await listening(run);
      const body = { prompt: want.prompt_ids, max_tokens: 24, temperature: 0, logprobs: 1 };
      // Two requests at once: the second waits for the first (one request at a time across ranks).
      const rs = await Promise.all([0, 1].map(() => fetch(`${url}/v1/completions`, { method: "POST", body: JSON.stringify(body) })));
      for (const r of rs) {
        expect(r.status).toBe(200);
        const j = (await r.json()) as { choices: { logprobs: { content: { id: number }[] } }[] };
        expect(j.choices[0]!.logprobs.content.map((e) => e.id)).toEqual(want.generated_ids);
      }
      // A bad request is the same 400 as on one process, before any step reaches the followers.
      const bad = await fetch(`${url}/v1/completions`, { method: "POST", body: JSON.stringify({ prompt: [999999], max_tokens: 2 }) });
      expect(bad.status).toBe(400);
      expect(((await bad.json()) as { error: { message: string } }).error.message).toMatch(/outside the vocabulary/);
    } finally {
      run.p.kill("SIGTERM");
      await run.done;
    }
    expect(run.stderr).toMatch(/tensor-parallel rank 0/);
  });

  // Rank 0 killed: its process (model thread and all) is gone, so the answer must come from the
  // launcher's HTTP front, the one process that runs no collective (the case of a rank 0 segfault).
  for (const [who, rank, how, signal, timeout] of [
    ["a follower", 1, "killed", "SIGKILL", "20"],
    ["a follower", 1, "stopped (hung)", "SIGSTOP", "3"],
    ["rank 0", 0, "killed", "SIGKILL", "20"],
  ] as const) {
    test(`serve: ${who} ${how} mid-stream: the client gets an error event, the launcher names the rank and exits 1`, async () => {
      const run = startLaunch(["-n", "2", "--timeout", timeout, "--", "serve", "--model", model, "--port", "0", "--no-web"]);
      try {
        const url = await listening(run);
        const res = await fetch(`${url}/v1/completions`, {
          method: "POST",
          body: JSON.stringify({ prompt: "hi", max_tokens: 3000, temperature: 0, stream: true }),
        });
        expect(res.status).toBe(200);
        const reader = res.body!.getReader();
        const dec = new TextDecoder();
        let text = "";
        while ((text.match(/^data: /gm)?.length ?? 0) < 5) {
          const r = await reader.read();
          if (r.done) break;
          text += dec.decode(r.value);
        }
        const killedAt = Date.now();
        process.kill(run.pids.get(rank)!, signal);
        let closedAt = 0;
        for (;;) {
          const r = await reader.read();
          if (r.done) {
            closedAt = Date.now();
            break;
          }
          text += dec.decode(r.value);
        }
        const code = await run.done;
        const took = (Date.now() - killedAt) / 1000;
        // The stream ends with an OpenAI-shaped error event, not a reset or a [DONE].
        const last = text.trim().split("\n\n").at(-1)!;
        expect(last).toMatch(/^data: \{"error":/);
        const err = JSON.parse(last.slice(6)) as { error: { message: string; type: string } };
        expect(err.error.type).toBe("server_error");
        if (rank === 0) expect(err.error.message).toBe("the tensor-parallel group is being stopped: rank 0 was killed by SIGKILL");
        else
          expect(err.error.message).toMatch(
            signal === "SIGKILL" ? /rank 1 was killed by SIGKILL|connection to a peer was lost/ : /rank 1 sent no heartbeat for 3 s/,
          );
        // Answered within the rank timeout (a killed peer: at once), group gone within it plus the 2 s kill grace.
        expect((closedAt - killedAt) / 1000).toBeLessThan(signal === "SIGKILL" ? 2 : Number(timeout) + 1.5);
        expect(code).toBe(1);
        if (rank === 0) expect(run.stderr).toMatch(/rank 0 was killed by SIGKILL; stopping the group/);
        else if (signal === "SIGKILL")
          expect(run.stderr).toMatch(/rank 1 was killed by SIGKILL; stopping the group|rank 0 exited with code 1; stopping the group/);
        else expect(run.stderr).toMatch(/rank 1 sent no heartbeat for 3 s \(process stopped\)(; ranks 0 waited on it)?; stopping the group/);
        expect(took).toBeLessThan(Number(timeout) + 4);
      } catch (e) {
        throw new Error(`${(e as Error).message}\n${run.stderr}`);
      } finally {
        // Nothing of the group may outlive the test (a stopped rank would hold the pipes open).
        for (const pid of run.pids.values()) {
          try {
            process.kill(pid, "SIGKILL");
          } catch {
            // already gone
          }
        }
        await run.done;
      }
    });
  }
});
