// SIGKILLs during prompt-cache saves (issue: "no orphaned temp files after 30 SIGKILLs during
// saves"). A writer process saves one file in a loop; it is killed 30 times, half the time as soon
// as its temporary file appears (mid-write), half after a random delay. After every kill the file
// at the path is absent or whole (the write is atomic: it verifies against its hashes); the next
// save removes every temporary file the killed writers left.
import { existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { afterAll, expect, test } from "vitest";
import { KVCache } from "@mlx-bun/kv-cache";
import { evaluate } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { savePromptCache, verifyPromptCache } from "../src/kv-store.ts";
import { tempDir } from "./kv-helpers.ts";

const tmp = tempDir("mlxb-killsave-");
afterAll(() => tmp.cleanup());

const WORKER = join(import.meta.dirname, "save-loop-worker.ts");
const KILLS = 30;
const temps = () => readdirSync(tmp.dir).filter((f) => f.endsWith(".tmp"));
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Resolves when the child's stdout has printed `line`. */
async function waitFor(stream: ReadableStream<Uint8Array>, line: string): Promise<void> {
  const reader = stream.getReader();
  let seen = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`the writer exited before printing "${line}": ${seen}`);
    seen += new TextDecoder().decode(value);
    if (seen.split("\n").includes(line)) break;
  }
  reader.releaseLock();
}

test(`${KILLS} SIGKILLs during saves: the file is always absent or whole; the next save leaves no temporary files`, async () => {
  const path = join(tmp.dir, "prompt.safetensors");
  let midWrite = 0;
  let orphaned = 0; // temporaries the killed writers left (each writer's first save removes the earlier ones)
  for (let i = 0; i < KILLS; i++) {
    const child = Bun.spawn([process.execPath, WORKER, path, "fp-test"], { stdout: "pipe", stderr: "pipe" });
    await waitFor(child.stdout, "ready");
    if (i % 2 === 0) {
      // Kill as soon as a temporary file of this writer exists: between its write and its rename.
      const mine = `.${child.pid}.`;
      const deadline = Date.now() + 20_000;
      while (!temps().some((f) => f.includes(mine)) && Date.now() < deadline) await sleep(1);
      midWrite++;
    } else {
      await sleep(Math.floor(Math.random() * 400));
    }
    child.kill("SIGKILL");
    expect(await child.exited).not.toBe(0); // reaped: its pid no longer looks alive
    if (existsSync(path)) expect(() => verifyPromptCache(path)).not.toThrow();
    orphaned += temps().filter((f) => f.includes(`.${child.pid}.`)).length;
  }
  // The kills did leave temporaries behind (else this test would prove nothing).
  console.log(`${KILLS} kills (${midWrite} as a temporary file appeared): ${orphaned} temporary files orphaned, each removed by the next save`);
  expect(orphaned).toBeGreaterThanOrEqual(midWrite / 2);
  const left = temps().length;

  const c = new KVCache();
  {
    using k = mx.random.normal([1, 1, 4, 64], { dtype: "bfloat16" });
    using view = c.updateAndFetch(k, k);
    evaluate(...view.planes);
  }
  const saved = savePromptCache(path, { fingerprint: "fp-test", caches: [c], tokens: [1, 2, 3, 4] });
  c.dispose();
  expect(saved.removedTemps.length).toBe(left);
  expect(temps()).toEqual([]);
  expect(verifyPromptCache(path).info.tokenCount).toBe(4);
}, 300_000);
