// Download a model repository from the Hugging Face Hub (@huggingface/hub: listFiles +
// downloadFile) into a local cache: only the files a model needs, resumable partial files,
// verified hashes, atomic renames, and a manifest that makes the next start offline.
import { createHash } from "node:crypto";
import { createReadStream, existsSync, mkdirSync, readFileSync, renameSync, statSync, unlinkSync, writeFileSync } from "node:fs";
import { open } from "node:fs/promises";
import { homedir } from "node:os";
import { dirname, join } from "node:path";
import { downloadFile, type ListFileEntry, listFiles } from "@huggingface/hub";
import cliProgress from "cli-progress";

export const DEFAULT_HUB_URL = "https://huggingface.co";
const MANIFEST = ".mlx-bun-snapshot.json";

/** The hub to talk to: MLX_BUN_HF_ENDPOINT, else HF_ENDPOINT, else huggingface.co. */
export function hubUrlFromEnv(env: Record<string, string | undefined> = process.env): string {
  return (env.MLX_BUN_HF_ENDPOINT || env.HF_ENDPOINT || DEFAULT_HUB_URL).replace(/\/+$/, "");
}

/** The download cache: $MLX_BUN_CACHE, else ~/.cache/mlx-bun/hub. */
export function defaultCacheDir(env: Record<string, string | undefined> = process.env): string {
  return env.MLX_BUN_CACHE || join(homedir(), ".cache", "mlx-bun", "hub");
}

/** "owner/name" (letters, digits, "-", "_", "."), as the Hub names model repositories. */
export function isRepoId(s: string): boolean {
  return /^[A-Za-z0-9][\w.-]*\/[\w.-]*[A-Za-z0-9_]$/.test(s) && !s.includes("..") && !s.startsWith(".") && !s.startsWith("/");
}

/** Files a model needs: configs (*.json), weights (*.safetensors), tokenizer files, chat templates (*.jinja); top level only. */
export function isModelFile(path: string): boolean {
  if (path.includes("/")) return false;
  if (/\.(json|safetensors|jinja)$/.test(path)) return true;
  return ["tokenizer.model", "tiktoken.model", "merges.txt", "vocab.txt"].includes(path) || path.endsWith(".tiktoken");
}

/** Where a repository's snapshot lives in the cache. */
export function snapshotDir(cacheDir: string, repo: string, revision = "main"): string {
  const [owner, name] = repo.split("/");
  return join(cacheDir, `models--${owner}--${name}`, encodeURIComponent(revision));
}

export interface DownloadProgress {
  /** Once, before any byte: the files to fetch and their total size. */
  start(totalBytes: number, files: { path: string; size: number }[]): void;
  /** Bytes of `path` received (already-present bytes of a resumed file are reported once, up front). */
  advance(bytes: number, path: string): void;
  stop(): void;
}

export interface DownloadOptions {
  hubUrl?: string;
  cacheDir?: string;
  revision?: string;
  /** Defaults to $HF_TOKEN. */
  accessToken?: string;
  /** true: a progress bar on stderr (a line per file when stderr is not a terminal); false: silent; or your own sink. */
  progress?: boolean | DownloadProgress;
  /** Retries of one file after a dropped connection, each resuming where it stopped (default 5). */
  maxRetries?: number;
  /** Use only what the cache holds ($HF_HUB_OFFLINE=1 sets it). */
  offline?: boolean;
  signal?: AbortSignal;
  fetch?: typeof fetch;
}

interface ManifestFile {
  path: string;
  size: number;
  oid?: string;
  sha256?: string;
}

interface Manifest {
  repo: string;
  revision: string;
  hubUrl: string;
  files: ManifestFile[];
  completedAt: string;
}

/** The cached snapshot of `repo` if it is complete (every listed file present with its size), else null. */
export function cachedSnapshot(repo: string, opts: { cacheDir?: string; revision?: string } = {}): string | null {
  const dir = snapshotDir(opts.cacheDir ?? defaultCacheDir(), repo, opts.revision);
  const mf = join(dir, MANIFEST);
  if (!existsSync(mf)) return null;
  try {
    const m = JSON.parse(readFileSync(mf, "utf8")) as Manifest;
    for (const f of m.files) {
      const p = join(dir, f.path);
      if (!existsSync(p) || statSync(p).size !== f.size) return null;
    }
    return dir;
  } catch {
    return null;
  }
}

/**
 * Make sure the model files of `repo` are in the cache and return the snapshot directory.
 * A complete snapshot is used as it is, with no network request.
 */
export async function downloadModel(repo: string, opts: DownloadOptions = {}): Promise<string> {
  if (!isRepoId(repo)) throw new Error(`not a Hugging Face repo id: ${JSON.stringify(repo)} (expected owner/name)`);
  const cacheDir = opts.cacheDir ?? defaultCacheDir();
  const revision = opts.revision ?? "main";
  const cached = cachedSnapshot(repo, { cacheDir, revision });
  if (cached) return cached;
  const offline = opts.offline ?? ["1", "true", "yes"].includes((process.env.HF_HUB_OFFLINE ?? "").toLowerCase());
  if (offline) throw new Error(`${repo} is not in the cache (${cacheDir}) and offline mode is on (HF_HUB_OFFLINE)`);

  const hubUrl = (opts.hubUrl ?? hubUrlFromEnv()).replace(/\/+$/, "");
  const accessToken = opts.accessToken ?? (process.env.HF_TOKEN || undefined);
  const common = {
    repo: { type: "model" as const, name: repo },
    revision,
    hubUrl,
    ...(accessToken ? { accessToken } : {}),
    ...(opts.fetch ? { fetch: opts.fetch } : {}),
  };

  let entries: ListFileEntry[] = [];
  try {
    for await (const e of listFiles({ ...common, recursive: false })) entries.push(e);
  } catch (e) {
    throw new Error(`cannot list ${repo}@${revision} on ${hubUrl}: ${(e as Error).message}`);
  }
  entries = entries.filter((e) => e.type === "file" && isModelFile(e.path));
  if (!entries.some((e) => e.path === "config.json")) throw new Error(`${repo}@${revision} has no config.json: not a model repository`);
  if (!entries.some((e) => e.path.endsWith(".safetensors"))) throw new Error(`${repo}@${revision} has no *.safetensors weights`);

  const dir = snapshotDir(cacheDir, repo, revision);
  mkdirSync(dir, { recursive: true });
  const files: ManifestFile[] = entries.map((e) => ({
    path: e.path,
    size: e.lfs?.size ?? e.size,
    ...(e.oid ? { oid: e.oid } : {}),
    ...(e.lfs?.oid ? { sha256: e.lfs.oid } : {}),
  }));
  // Small files (configs, tokenizer) first, the weights last.
  const todo = files.filter((f) => !(existsSync(join(dir, f.path)) && statSync(join(dir, f.path)).size === f.size)).sort((a, b) => a.size - b.size);
  const progress = makeProgress(opts.progress ?? true, repo);
  progress.start(
    todo.reduce((s, f) => s + f.size, 0),
    todo.map((f) => ({ path: f.path, size: f.size })),
  );
  try {
    for (const f of todo) await fetchOne(common, dir, f, progress, opts);
  } finally {
    progress.stop();
  }
  const manifest: Manifest = { repo, revision, hubUrl, files, completedAt: new Date().toISOString() };
  atomicWrite(join(dir, MANIFEST), `${JSON.stringify(manifest, null, 2)}\n`);
  return dir;
}

type Common = Omit<Parameters<typeof downloadFile>[0], "path">;

async function fetchOne(common: Common, dir: string, f: ManifestFile, progress: DownloadProgress, opts: DownloadOptions): Promise<void> {
  const final = join(dir, f.path);
  const part = `${final}.part`;
  mkdirSync(dirname(final), { recursive: true });
  const maxRetries = opts.maxRetries ?? 5;
  let blob: Blob | null = null;
  let restarted = false;
  for (let attempt = 0; ; attempt++) {
    let have = existsSync(part) ? statSync(part).size : 0;
    if (have > f.size) {
      unlinkSync(part);
      have = 0;
    }
    if (attempt === 0 && have > 0) progress.advance(have, f.path);
    try {
      if (have < f.size) {
        opts.signal?.throwIfAborted();
        blob ??= await downloadFile({ ...common, path: f.path } as Parameters<typeof downloadFile>[0]);
        if (!blob) throw new Error(`${f.path}: not found on the hub`);
        if (blob.size !== f.size) throw new Error(`${f.path}: the hub reports ${blob.size} bytes, the listing ${f.size}`);
        await appendStream(blob.slice(have).stream(), part, (n) => progress.advance(n, f.path), opts.signal);
      }
      const size = statSync(part).size;
      if (size !== f.size) throw new Error(`${f.path}: got ${size} of ${f.size} bytes`);
      await verify(part, f);
      renameSync(part, final);
      return;
    } catch (e) {
      if (opts.signal?.aborted) throw e;
      if (e instanceof HashMismatch) {
        // A corrupt partial file (or a server that ignored the range): start over once.
        unlinkSync(part);
        if (restarted) throw e;
        restarted = true;
        continue;
      }
      if (attempt >= maxRetries) throw new Error(`downloading ${f.path} failed after ${attempt + 1} attempts: ${(e as Error).message}`);
      await Bun.sleep(Math.min(200 * 2 ** attempt, 5000));
    }
  }
}

async function appendStream(stream: ReadableStream<Uint8Array>, file: string, onBytes: (n: number) => void, signal?: AbortSignal): Promise<void> {
  const fh = await open(file, "a");
  try {
    const reader = stream.getReader();
    try {
      for (;;) {
        if (signal?.aborted) {
          await reader.cancel().catch(() => {});
          signal.throwIfAborted();
        }
        const { value, done } = await reader.read();
        if (done) break;
        await fh.write(value);
        onBytes(value.byteLength);
      }
    } finally {
      reader.releaseLock();
    }
    await fh.sync();
  } finally {
    await fh.close();
  }
}

class HashMismatch extends Error {}

/** LFS files: sha256 of the content; other files: the git blob sha1. */
async function verify(file: string, f: ManifestFile): Promise<void> {
  if (!f.sha256 && !f.oid) return;
  const h = createHash(f.sha256 ? "sha256" : "sha1");
  if (!f.sha256) h.update(`blob ${f.size}\0`);
  for await (const chunk of createReadStream(file)) h.update(chunk as Buffer);
  const got = h.digest("hex");
  const want = f.sha256 ?? f.oid!;
  if (got !== want) throw new HashMismatch(`${f.path}: content hash ${got} does not match the hub's ${want}`);
}

function atomicWrite(file: string, text: string): void {
  const tmp = `${file}.tmp-${process.pid}`;
  writeFileSync(tmp, text);
  renameSync(tmp, file);
}

function formatBytes(n: number): string {
  const u = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < u.length - 1) {
    n /= 1000;
    i++;
  }
  return `${n.toFixed(i ? 1 : 0)} ${u[i]}`;
}

const SILENT: DownloadProgress = { start() {}, advance() {}, stop() {} };

function makeProgress(p: boolean | DownloadProgress, repo: string): DownloadProgress {
  if (p === false) return SILENT;
  if (p !== true) return p;
  if (!process.stderr.isTTY) {
    return {
      start(total, files) {
        if (files.length) process.stderr.write(`Fetching ${files.length} files of ${repo} (${formatBytes(total)})\n`);
        for (const f of files) process.stderr.write(`  ${f.path} (${formatBytes(f.size)})\n`);
      },
      advance() {},
      stop() {},
    };
  }
  let bar: cliProgress.SingleBar | null = null;
  let done = 0;
  let total = 0;
  return {
    start(t) {
      total = t;
      if (!t) return;
      bar = new cliProgress.SingleBar(
        {
          stream: process.stderr,
          format: (_o, params, payload: { file?: string }) => {
            const width = 30;
            const filled = Math.round(params.progress * width);
            const pct = (params.progress * 100).toFixed(0).padStart(3);
            return `Fetching ${repo} [${"=".repeat(filled)}${" ".repeat(width - filled)}] ${pct}% ${formatBytes(done)}/${formatBytes(total)} ${payload.file ?? ""}`;
          },
          hideCursor: true,
          clearOnComplete: false,
          fps: 10,
        },
        cliProgress.Presets.shades_classic,
      );
      bar.start(t, 0, { file: "" });
    },
    advance(n, path) {
      done += n;
      bar?.update(done, { file: path });
    },
    stop() {
      bar?.stop();
    },
  };
}
