// The web chat's files (apps/mlx-bun/web, built into web/dist by tools/setup.sh): read into memory
// when the server starts and served at "/" and "/assets/…" on the API's port. Only the files of
// that folder are ever served (an exact path lookup, no file-system path is built from a URL).
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { extname, join, relative, sep } from "node:path";
import { fileURLToPath } from "node:url";

/** Where tools/setup.sh builds the page (`bun apps/mlx-bun/web/build.ts`). */
export const DEFAULT_WEB_DIR = fileURLToPath(new URL("../../web/dist", import.meta.url));

const TYPES: Record<string, string> = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".json": "application/json",
  ".svg": "image/svg+xml",
  ".png": "image/png",
  ".ico": "image/x-icon",
  ".txt": "text/plain; charset=utf-8",
  ".woff2": "font/woff2",
};

/**
 * The page may load its own files and talk to its own origin, nothing else: model output that got
 * past the sanitizer still could not run a script or reach another host.
 */
const SECURITY_HEADERS = {
  "Content-Security-Policy":
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
  "X-Content-Type-Options": "nosniff",
  "Referrer-Policy": "no-referrer",
  "X-Frame-Options": "DENY",
};

interface Asset {
  body: Uint8Array;
  type: string;
  cache: string;
}

export class WebChat {
  readonly assets = new Map<string, Asset>();
  /** Set when the page was asked for but is not built. */
  readonly missing: string | null = null;

  /** `dir`: the built page; null: no page (every path but the API is a 404). */
  constructor(readonly dir: string | null) {
    if (dir === null) return;
    if (!existsSync(join(dir, "index.html"))) {
      this.missing = dir;
      return;
    }
    for (const file of walk(dir)) {
      const rel = relative(dir, file).split(sep).join("/");
      if (rel.split("/").some((part) => part.startsWith("."))) continue;
      const isIndex = rel === "index.html";
      this.assets.set(`/${rel}`, {
        body: readFileSync(file),
        type: TYPES[extname(rel)] ?? "application/octet-stream",
        // Asset names carry a content hash: cached for good. The page itself is checked each time.
        cache: isIndex ? "no-cache" : "public, max-age=31536000, immutable",
      });
    }
    const index = this.assets.get("/index.html");
    if (index) this.assets.set("/", index);
  }

  /** Whether `path` is the page or one of its files (for GET/HEAD). */
  has(path: string): boolean {
    return this.assets.has(path) || (this.missing !== null && path === "/");
  }

  serve(req: Request, path: string): Response {
    const a = this.assets.get(path);
    if (!a) {
      const text = `<!doctype html><meta charset="utf-8"><title>mlx-bun</title><p>The web chat is not built (no ${this.missing}/index.html). Run <code>bash tools/setup.sh</code> or <code>bun apps/mlx-bun/web/build.ts</code>. The API works: <code>/v1/chat/completions</code>, <code>/health</code>.</p>`;
      return new Response(text, { status: 503, headers: { "Content-Type": TYPES[".html"]!, "Cache-Control": "no-store", ...SECURITY_HEADERS } });
    }
    const headers = { "Content-Type": a.type, "Content-Length": String(a.body.byteLength), "Cache-Control": a.cache, ...SECURITY_HEADERS };
    return new Response(req.method === "HEAD" ? null : a.body, { status: 200, headers });
  }
}

function walk(dir: string): string[] {
  const out: string[] = [];
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) out.push(...walk(p));
    else if (e.isFile()) out.push(p);
  }
  return out;
}
