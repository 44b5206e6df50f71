// A local stand-in for the few Hugging Face Hub endpoints @huggingface/hub calls to list and
// download a repository, on 127.0.0.1: GET /api/models/{repo}/tree/{rev}, GET /{repo}/resolve/{rev}/{path}
// (with Range requests, ETag and Content-Range as the Hub sends them). It can drop a connection
// half way through a file, to test resuming.
import { createHash } from "node:crypto";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";

export interface HubRequest {
  method: string;
  path: string;
  range: string | null;
}

export interface FakeHubOptions {
  /** repo id → directory whose top-level files the repo holds. */
  repos: Record<string, string>;
  /** Extra files per repo (path → content), e.g. ones a model download must skip. */
  extraFiles?: Record<string, Record<string, Uint8Array | string>>;
  /** Files whose next N full-content responses stop half way (the connection is dropped). */
  dropHalfway?: Record<string, number>;
  /** Files whose content responses all end at this byte offset (a request from beyond it gets none) until changed. */
  stallAfter?: Record<string, number>;
}

export interface FakeHub {
  url: string;
  requests: HubRequest[];
  /** Mutable: set drop/stall behaviour between downloads. */
  opts: FakeHubOptions;
  files(repo: string): Map<string, Uint8Array>;
  stop(): Promise<void>;
}

function gitBlobSha1(b: Uint8Array): string {
  return createHash("sha1").update(`blob ${b.byteLength}\0`).update(b).digest("hex");
}

function sha256(b: Uint8Array): string {
  return createHash("sha256").update(b).digest("hex");
}

export function startFakeHub(opts: FakeHubOptions): FakeHub {
  const content = new Map<string, Map<string, Uint8Array>>();
  for (const [repo, dir] of Object.entries(opts.repos)) {
    const m = new Map<string, Uint8Array>();
    for (const f of readdirSync(dir)) if (statSync(join(dir, f)).isFile() && !f.startsWith(".")) m.set(f, new Uint8Array(readFileSync(join(dir, f))));
    for (const [p, c] of Object.entries(opts.extraFiles?.[repo] ?? {})) m.set(p, typeof c === "string" ? new TextEncoder().encode(c) : c);
    content.set(repo, m);
  }
  const requests: HubRequest[] = [];
  const state = { opts };

  const server = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    fetch(req) {
      const url = new URL(req.url);
      const path = decodeURIComponent(url.pathname);
      requests.push({ method: req.method, path, range: req.headers.get("range") });
      // listFiles: /api/models/{owner}/{name}/tree/{rev}[/{path}]
      let m = /^\/api\/models\/([^/]+\/[^/]+)\/tree\/([^/]+)(?:\/(.*))?$/.exec(path);
      if (m) {
        const files = content.get(m[1]!);
        if (!files) return notFound("RepoNotFound", "Repository not found");
        const recursive = url.searchParams.get("recursive") === "true";
        const entries = [...files].flatMap(([p, b]) => {
          if (!recursive && p.includes("/")) {
            const d = p.split("/")[0]!;
            return [{ type: "directory", oid: sha256(new TextEncoder().encode(d)).slice(0, 40), size: 0, path: d }];
          }
          const lfs = p.endsWith(".safetensors") || p.endsWith(".bin");
          if (!lfs) return [{ type: "file", oid: gitBlobSha1(b), size: b.byteLength, path: p }];
          // As the Hub: the git oid is the LFS pointer's, the content's sha256 is lfs.oid.
          const pointer = new TextEncoder().encode(`version https://git-lfs.github.com/spec/v1\noid sha256:${sha256(b)}\nsize ${b.byteLength}\n`);
          return [
            {
              type: "file",
              oid: gitBlobSha1(pointer),
              size: b.byteLength,
              path: p,
              lfs: { oid: sha256(b), size: b.byteLength, pointerSize: pointer.byteLength },
            },
          ];
        });
        const seen = new Set<string>();
        return Response.json(entries.filter((e) => !seen.has(e.path) && seen.add(e.path)));
      }
      // downloadFile / fileDownloadInfo: /{owner}/{name}/resolve/{rev}/{path}
      m = /^\/([^/]+\/[^/]+)\/resolve\/([^/]+)\/(.+)$/.exec(path);
      if (m) {
        const files = content.get(m[1]!);
        if (!files) return notFound("RepoNotFound", "Repository not found");
        const file = m[3]!;
        const b = files.get(file);
        if (!b) return notFound("EntryNotFound", `${file} does not exist on "${m[2]}"`);
        const etag = `"${sha256(b)}"`;
        const range = req.headers.get("range");
        let start = 0;
        let end = b.byteLength - 1;
        let status = 200;
        if (range) {
          const r = /^bytes=(\d+)-(\d*)$/.exec(range);
          if (!r) return new Response("bad range", { status: 416 });
          start = Number(r[1]);
          end = r[2] ? Math.min(Number(r[2]), b.byteLength - 1) : b.byteLength - 1;
          if (start >= b.byteLength) return new Response("", { status: 416, headers: { "Content-Range": `bytes */${b.byteLength}` } });
          status = 206;
        }
        const slice = b.subarray(start, end + 1);
        const headers: Record<string, string> = {
          ETag: etag,
          "X-Repo-Commit": "0".repeat(40),
          "Accept-Ranges": "bytes",
          "Content-Type": "application/octet-stream",
          "Content-Length": String(slice.byteLength),
        };
        if (status === 206) headers["Content-Range"] = `bytes ${start}-${end}/${b.byteLength}`;
        // Drops and stalls apply to content requests, not the 1-byte size probe.
        const isProbe = range === "bytes=0-0";
        const drops = state.opts.dropHalfway?.[file] ?? 0;
        const stall = state.opts.stallAfter?.[file];
        let cut: number | undefined;
        if (!isProbe && drops > 0 && slice.byteLength > 1) {
          state.opts.dropHalfway![file] = drops - 1;
          cut = Math.floor(b.byteLength / 2) - start;
          if (cut <= 0) cut = Math.floor(slice.byteLength / 2);
        } else if (!isProbe && stall !== undefined) cut = Math.max(0, stall - start);
        if (cut !== undefined) {
          const head = slice.subarray(0, cut);
          // Send part of the body, then fail the stream: the client sees the connection end early.
          const body = new ReadableStream<Uint8Array>({
            start(c) {
              c.enqueue(head);
              setTimeout(() => c.error(new Error("fake hub: dropped the connection")), 20);
            },
          });
          return new Response(body, { status, headers });
        }
        return new Response(slice, { status, headers });
      }
      return notFound("RepoNotFound", `no route for ${path}`);
    },
  });

  return {
    url: `http://127.0.0.1:${server.port}`,
    requests,
    get opts() {
      return state.opts;
    },
    set opts(o) {
      state.opts = o;
    },
    files: (repo) => content.get(repo) ?? new Map(),
    stop: async () => {
      await server.stop(true);
    },
  };
}

function notFound(code: string, message: string): Response {
  return Response.json({ error: message }, { status: 404, headers: { "X-Error-Code": code } });
}
