// mlx-bun verify: KV snapshots (ours: header hash and data hashes; mlx-lm's: structure, no checksum)
// and checkpoints (structure, sizes against the file, dtypes, loads as Gemma 4; no checksum).
import { execFileSync } from "node:child_process";
import { copyFileSync, cpSync, readFileSync, truncateSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, expect, test } from "vitest";
import { oraclePython } from "../../../tools/oracle/oracle.ts";
import { makeTinySmall, ROOT, runCli, tempDir } from "./helpers.ts";

let tmp: ReturnType<typeof tempDir>;
let model = "";
let ours = "";
let theirs = "";

beforeAll(async () => {
  tmp = tempDir("mlxb-verify-");
  model = makeTinySmall(join(tmp.path, "tiny"));
  ours = join(tmp.path, "ours.safetensors");
  theirs = join(tmp.path, "theirs.safetensors");
  const r = await runCli(["cache-prompt", "--model", model, "--prompt", "a prompt to keep", "--prompt-cache-file", ours]);
  expect(r.code, r.stderr).toBe(0);
  execFileSync(oraclePython(), ["-m", "mlx_lm", "cache_prompt", "--model", model, "--prompt", "a prompt to keep", "--prompt-cache-file", theirs], {
    cwd: ROOT,
    stdio: "ignore",
  });
}, 120_000);
afterAll(() => tmp?.cleanup());

test("good files: ours (hashes checked), mlx-lm's (no checksum, said so), a checkpoint and one of its weight files", async () => {
  const r = await runCli(["verify", ours, theirs, model, join(model, "model.safetensors")]);
  expect(r.code, r.stderr).toBe(0);
  expect(r.stdout).toContain(`${ours}: OK (kv-snapshot)`);
  expect(r.stdout).toMatch(/ok {4}mlx-bun KV snapshot, format version 2: header hash matches/);
  expect(r.stdout).toMatch(/ok {4}data: \d+ cache tensors and the \d+ token ids match their xxHash3/);
  expect(r.stdout).toContain(`${theirs}: OK (mlx-lm-prompt-cache)`);
  expect(r.stdout).toMatch(/note  mlx-lm's files carry no checksum/);
  expect(r.stdout).toContain(`${model}: OK (checkpoint)`);
  expect(r.stdout).toMatch(/ok {4}model\.safetensors: \d+ tensors \(.*bfloat16.*\), sizes match dtypes and shapes, no overlaps or holes/);
  expect(r.stdout).toMatch(/ok {4}loads as Gemma 4 \(gemma4, 6 layers/);
  expect(r.stdout).toMatch(/note  checkpoints carry no checksum: the structure is checked, the weight values cannot be/);
  expect(r.stdout).toContain(`${join(model, "model.safetensors")}: OK (safetensors)`);
  const j = await runCli(["verify", "--json", ours]);
  expect(JSON.parse(j.stdout)).toMatchObject({ path: ours, kind: "kv-snapshot", ok: true });
});

test("bad files: each a clear FAILED line, exit 1, no stack trace; a FIFO is refused without blocking", async () => {
  const relabelled = join(tmp.path, "relabelled.safetensors");
  copyFileSync(ours, relabelled);
  const b = readFileSync(relabelled);
  b.write('"dtype":"F16" ', b.indexOf('"dtype":"BF16"'), "latin1");
  writeFileSync(relabelled, b);
  const flipped = join(tmp.path, "flipped.safetensors");
  copyFileSync(ours, flipped);
  const c = readFileSync(flipped);
  c[c.length - 2] = c[c.length - 2]! ^ 0xff;
  writeFileSync(flipped, c);
  const truncated = join(tmp.path, "trunc");
  cpSync(model, truncated, { recursive: true });
  truncateSync(join(truncated, "model.safetensors"), 4000);
  const reshaped = join(tmp.path, "reshaped");
  cpSync(model, reshaped, { recursive: true });
  const cfg = JSON.parse(readFileSync(join(reshaped, "config.json"), "utf8"));
  cfg.text_config.intermediate_size *= 2;
  writeFileSync(join(reshaped, "config.json"), JSON.stringify(cfg));
  const fifo = join(tmp.path, "pipe");
  execFileSync("mkfifo", [fifo]);
  const cases: [string, RegExp][] = [
    [relabelled, /FAILED kv-store .*relabelled\.safetensors: the header does not match its hash/],
    [flipped, /FAILED kv-store .*flipped\.safetensors: tensor '.*' does not match its saved hash: corrupt data/],
    [truncated, /FAILED .*trunc\/model\.safetensors: .*(past the data section|truncated)/],
    [reshaped, /FAILED .*reshaped: does not load as Gemma 4: .*/],
    [tmp.path, /FAILED .*: no config\.json \(not a checkpoint directory\)/],
    [fifo, /FAILED .*pipe: a FIFO, not a regular file/],
    [join(tmp.path, "none"), /FAILED .*none: no such file or directory/],
  ];
  for (const [path, re] of cases) {
    const t0 = performance.now();
    const r = await runCli(["verify", path], { timeoutMs: 20_000 });
    expect(r.code, path).toBe(1);
    expect(r.stderr, path).toMatch(re);
    expect(r.stderr, path).not.toMatch(/\n\s+at /);
    expect(performance.now() - t0, path).toBeLessThan(15_000);
  }
  // Several paths: the good ones pass, the exit code says one failed.
  const mixed = await runCli(["verify", ours, flipped]);
  expect(mixed.code).toBe(1);
  expect(mixed.stdout).toContain(`${ours}: OK`);
});
