// Builds the web chat of `mlx-bun serve` with Bun.build: index.html + src/*.ts + src/style.css
// (markdown-it and DOMPurify bundled in; highlight.js and KaTeX as chunks loaded on first need)
// → dist/ (git-ignored), served at "/" by the server.
// tools/setup.sh runs it; by hand: `.native/bin/bun apps/mlx-bun/web/build.ts [outdir]`.
import { readdirSync, rmSync } from "node:fs";
import { join, relative } from "node:path";
import { fileURLToPath } from "node:url";

export const WEB_ROOT = fileURLToPath(new URL(".", import.meta.url));
export const WEB_DIST = join(WEB_ROOT, "dist");

/** Build into `outDir` (emptied first); returns the files written, relative to it. */
export async function buildWeb(outDir: string = WEB_DIST): Promise<string[]> {
  rmSync(outDir, { recursive: true, force: true });
  // Bun.build's content hashes depend on the working directory (module paths are relative to it):
  // build from this folder, so that setup.sh (repo root) and the tests (apps/mlx-bun) agree.
  const cwd = process.cwd();
  process.chdir(WEB_ROOT);
  const result = await Bun.build({
    entrypoints: [join(WEB_ROOT, "index.html")],
    outdir: outDir,
    target: "browser",
    minify: true,
    // highlight.js and KaTeX are imported on first need (markdown.ts): chunks of their own.
    splitting: true,
    // Content-hashed asset names: the server lets browsers cache them for good.
    naming: { entry: "[name].[ext]", chunk: "assets/[name]-[hash].[ext]", asset: "assets/[name]-[hash].[ext]" },
    define: { "process.env.NODE_ENV": '"production"' },
  }).finally(() => process.chdir(cwd));
  if (!result.success) {
    throw new Error(`web chat build failed:\n${result.logs.map((l) => String(l)).join("\n")}`);
  }
  return listFiles(outDir);
}

export function listFiles(dir: string): string[] {
  const out: string[] = [];
  const walk = (d: string) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.isFile()) out.push(relative(dir, p));
    }
  };
  walk(dir);
  return out.sort();
}

if (import.meta.main) {
  const out = process.argv[2] ?? WEB_DIST;
  const files = await buildWeb(out);
  console.log(`web chat: ${files.length} files in ${relative(process.cwd(), out) || "."}: ${files.join(", ")}`);
}
