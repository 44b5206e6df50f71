// --model <repo id>: @huggingface/hub against a local fake hub (never the real network):
// model files only, byte-identical results, resume after a dropped connection and after an
// interrupted run, atomic renames, and a cached snapshot that needs no network.
import { existsSync, readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "vitest";
import { cachedSnapshot, downloadModel, hubUrlFromEnv, isModelFile, isRepoId, snapshotDir } from "../src/hub.ts";
import { resolveModel } from "../src/model-path.ts";
import { type FakeHub, startFakeHub } from "./fake-hub.ts";
import { makeTinySmall, runCli, tempDir } from "./helpers.ts";

const REPO = "tiny-org/tiny-gemma4";
const WEIGHTS = "model.safetensors";
let src: ReturnType<typeof tempDir>;
let hub: FakeHub;
let cache: ReturnType<typeof tempDir>;

beforeAll(() => {
  // The tests talk to a local fake hub only; an offline setting of the environment must not apply.
  delete process.env.HF_HUB_OFFLINE;
  src = tempDir("mlxb-hub-src-");
  makeTinySmall(src.path);
  hub = startFakeHub({
    repos: { [REPO]: src.path },
    extraFiles: {
      [REPO]: {
        "README.md": "# tiny\n",
        ".gitattributes": "*.safetensors filter=lfs\n",
        "pytorch_model.bin": new Uint8Array(4096).fill(7),
        "original/params.json": "{}",
      },
    },
  });
});

afterAll(async () => {
  await hub.stop();
  src.cleanup();
});

beforeEach(() => {
  cache?.cleanup();
  cache = tempDir("mlxb-hub-cache-");
  hub.requests.length = 0;
  hub.opts.dropHalfway = {};
  hub.opts.stallAfter = {};
});

const modelFiles = () => readdirSync(src.path).filter((f) => !f.startsWith("."));

function expectIdentical(dir: string): void {
  for (const f of modelFiles()) {
    expect(existsSync(join(dir, f)), f).toBe(true);
    expect(Buffer.compare(readFileSync(join(dir, f)), readFileSync(join(src.path, f))), f).toBe(0);
  }
  expect(readdirSync(dir).filter((f) => f.endsWith(".part"))).toEqual([]);
}

const opts = () => ({ hubUrl: hub.url, cacheDir: cache.path, progress: false as const });
const contentRequests = (file: string) => hub.requests.filter((r) => r.path.endsWith(`/${file}`) && r.range !== "bytes=0-0");

describe("names", () => {
  test("repo ids and model files", () => {
    expect(isRepoId("mlx-community/gemma-4-e2b-it-4bit")).toBe(true);
    expect(isRepoId("google/gemma-4-E2B")).toBe(true);
    for (const bad of ["gemma", "./a/b", "/abs/path", "a/b/c", "a/../b", ""]) expect(isRepoId(bad), bad).toBe(false);
    for (const f of [
      "config.json",
      "model-00001-of-00002.safetensors",
      "model.safetensors.index.json",
      "tokenizer.json",
      "tokenizer.model",
      "chat_template.jinja",
    ]) {
      expect(isModelFile(f), f).toBe(true);
    }
    for (const f of ["README.md", ".gitattributes", "pytorch_model.bin", "original/params.json", "consolidated.pth"]) expect(isModelFile(f), f).toBe(false);
  });

  test("hub URL from the environment", () => {
    expect(hubUrlFromEnv({})).toBe("https://huggingface.co");
    expect(hubUrlFromEnv({ HF_ENDPOINT: "http://127.0.0.1:1/" })).toBe("http://127.0.0.1:1");
    expect(hubUrlFromEnv({ HF_ENDPOINT: "http://a", MLX_BUN_HF_ENDPOINT: "http://b" })).toBe("http://b");
  });
});

describe("downloadModel", () => {
  test("fetches only the model files, byte-identical; a second call makes no request", async () => {
    const dir = await downloadModel(REPO, opts());
    expect(dir).toBe(snapshotDir(cache.path, REPO));
    expectIdentical(dir);
    const got = readdirSync(dir).filter((f) => !f.startsWith("."));
    expect(got.sort()).toEqual(modelFiles().sort());
    for (const skipped of ["README.md", "pytorch_model.bin", ".gitattributes", "original"]) expect(existsSync(join(dir, skipped)), skipped).toBe(false);
    expect(hub.requests.some((r) => r.path.includes("pytorch_model.bin"))).toBe(false);
    expect(cachedSnapshot(REPO, { cacheDir: cache.path })).toBe(dir);

    const before = hub.requests.length;
    expect(await downloadModel(REPO, opts())).toBe(dir);
    expect(hub.requests.length).toBe(before);
  });

  test("a connection dropped half way is resumed with a Range request", async () => {
    hub.opts.dropHalfway = { [WEIGHTS]: 1 };
    const dir = await downloadModel(REPO, opts());
    expectIdentical(dir);
    const size = statSync(join(src.path, WEIGHTS)).size;
    const reqs = contentRequests(WEIGHTS);
    expect(reqs.length).toBe(2);
    expect(reqs[1]!.range).toBe(`bytes=${Math.floor(size / 2)}-${size - 1}`);
  });

  test("an interrupted run leaves only a .part file; the next run resumes it", async () => {
    const size = statSync(join(src.path, WEIGHTS)).size;
    const stall = 300_000;
    hub.opts.stallAfter = { [WEIGHTS]: stall };
    await expect(downloadModel(REPO, { ...opts(), maxRetries: 1 })).rejects.toThrow(/model\.safetensors/);
    const dir = snapshotDir(cache.path, REPO);
    // Nothing half-written under the final name, no manifest.
    expect(existsSync(join(dir, WEIGHTS))).toBe(false);
    expect(statSync(join(dir, `${WEIGHTS}.part`)).size).toBe(stall);
    expect(cachedSnapshot(REPO, { cacheDir: cache.path })).toBeNull();

    hub.opts.stallAfter = {};
    hub.requests.length = 0;
    expect(await downloadModel(REPO, opts())).toBe(dir);
    expectIdentical(dir);
    const reqs = contentRequests(WEIGHTS);
    expect(reqs.map((r) => r.range)).toEqual([`bytes=${stall}-${size - 1}`]);
    // Files completed by the first run are not fetched again.
    for (const f of modelFiles().filter((f) => f !== WEIGHTS)) expect(contentRequests(f), f).toEqual([]);
  });

  test("a corrupt partial file fails its hash check and is fetched again", async () => {
    const size = statSync(join(src.path, WEIGHTS)).size;
    const dir = snapshotDir(cache.path, REPO);
    const { mkdirSync } = await import("node:fs");
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, `${WEIGHTS}.part`), new Uint8Array(size - 10).fill(1));
    await downloadModel(REPO, opts());
    expectIdentical(dir);
  });

  test("an unknown repo is a clear error", async () => {
    await expect(downloadModel("nobody/nothing", opts())).rejects.toThrow(/nobody\/nothing/);
    await expect(downloadModel("not-a-repo", opts())).rejects.toThrow(/not a Hugging Face repo id/);
  });

  test("offline mode uses the cache or says it cannot", async () => {
    await expect(downloadModel(REPO, { ...opts(), offline: true })).rejects.toThrow(/offline/);
    await downloadModel(REPO, opts());
    hub.requests.length = 0;
    await downloadModel(REPO, { ...opts(), offline: true });
    expect(hub.requests).toEqual([]);
  });
});

describe("--model with a repo id", () => {
  test("resolveModel downloads through MLX_BUN_HF_ENDPOINT into MLX_BUN_CACHE", async () => {
    const saved = { e: process.env.MLX_BUN_HF_ENDPOINT, c: process.env.MLX_BUN_CACHE };
    process.env.MLX_BUN_HF_ENDPOINT = hub.url;
    process.env.MLX_BUN_CACHE = cache.path;
    try {
      const m = await resolveModel(REPO, { progress: false });
      expect(m).toEqual({ dir: snapshotDir(cache.path, REPO), id: REPO, source: "hub" });
      expectIdentical(m.dir);
    } finally {
      for (const [k, v] of [
        ["MLX_BUN_HF_ENDPOINT", saved.e],
        ["MLX_BUN_CACHE", saved.c],
      ] as const) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
    }
  });

  test("mlx-bun download prints the snapshot directory", async () => {
    hub.opts.dropHalfway = { [WEIGHTS]: 1 };
    const r = await runCli(["download", REPO], { env: { HF_ENDPOINT: hub.url, MLX_BUN_HF_ENDPOINT: "", MLX_BUN_CACHE: cache.path } });
    expect(r.stderr).toContain(WEIGHTS);
    expect(r.code).toBe(0);
    expect(r.stdout.trim()).toBe(snapshotDir(cache.path, REPO));
    expectIdentical(r.stdout.trim());
  });

  test("a missing local path that is not a repo id is a clear error", async () => {
    await expect(resolveModel("./no/such/dir/here")).rejects.toThrow(/no such directory/);
  });
});
