// Publish manifests and tarballs: what each published package holds, and the rules it must meet.
//   preparePublishManifest  strips the repository-only "bun" export condition (TypeScript sources,
//                           for the workspace's tests and tools) so that exports, main and types
//                           name built files only
//   packPackage             `bun pm pack` (which turns workspace:* into the exact version)
//   checkTarball            no tests or fixtures, every exports/main/types/bin target packed,
//                           types beside every entry, no workspace: ranges, the native and model
//                           files a package exists for
//   bun tools/release/pack.ts <package dir>...   packs into a temp folder, prints the listing and the
//   problems of each package as it stands (check.ts first strips the "bun" condition in its copy,
//   so on the repository's own packages that condition is reported here)
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";

export interface TarEntry {
  path: string;
  size: number;
}

export interface Packed {
  name: string;
  version: string;
  dir: string;
  tarball: string;
  packedBytes: number;
  unpackedBytes: number;
  files: TarEntry[];
  manifest: Record<string, unknown>;
}

type Json = Record<string, unknown>;
const readJson = (p: string) => JSON.parse(readFileSync(p, "utf8")) as Json;

/** Entries of a .tgz (regular files), read in process: ustar headers, pax names. */
export function listTarball(tgz: string): { files: TarEntry[]; read(path: string): Uint8Array | undefined } {
  const data = Bun.gunzipSync(readFileSync(tgz));
  const files: TarEntry[] = [];
  const blobs = new Map<string, [number, number]>();
  const str = (a: number, b: number) => new TextDecoder().decode(data.subarray(a, b)).replace(/\0.*$/s, "");
  let off = 0;
  let paxPath: string | undefined;
  while (off + 512 <= data.length) {
    if (data.subarray(off, off + 512).every((b) => b === 0)) break;
    const name = str(off, off + 100);
    const size = Number.parseInt(str(off + 124, off + 136).trim() || "0", 8);
    const type = String.fromCharCode(data[off + 156]!);
    const prefix = str(off + 345, off + 500);
    const body = off + 512;
    if (type === "x") {
      const m = /\d+ path=([^\n]*)\n/.exec(str(body, body + size));
      paxPath = m?.[1];
    } else if (type === "0" || type === "\0") {
      const path = (paxPath ?? (prefix ? `${prefix}/${name}` : name)).replace(/^package\//, "");
      files.push({ path, size });
      blobs.set(path, [body, body + size]);
      paxPath = undefined;
    } else paxPath = undefined;
    off = body + Math.ceil(size / 512) * 512;
  }
  return {
    files,
    read: (p) => {
      const r = blobs.get(p);
      return r ? data.subarray(r[0], r[1]) : undefined;
    },
  };
}

/** Drop export conditions that point at TypeScript sources (the workspace's "bun" condition). */
export function preparePublishManifest(pkgDir: string): string[] {
  const file = join(pkgDir, "package.json");
  const pkg = readJson(file);
  const changes: string[] = [];
  const strip = (node: unknown, at: string): unknown => {
    if (!node || typeof node !== "object" || Array.isArray(node)) return node;
    const out: Json = {};
    for (const [k, v] of Object.entries(node as Json)) {
      if (typeof v === "string" && /\.tsx?$/.test(v) && !/\.d\.[cm]?ts$/.test(v)) {
        changes.push(`exports${at}.${k} (${v}) removed`);
        continue;
      }
      out[k] = strip(v, `${at}["${k}"]`);
    }
    return out;
  };
  if (pkg.exports) pkg.exports = strip(pkg.exports, "");
  if (changes.length) writeFileSync(file, `${JSON.stringify(pkg, null, 2)}\n`);
  return changes;
}

/** `bun pm pack` a package into `dest`. */
export function packPackage(pkgDir: string, dest: string, bun = process.execPath): Packed {
  const p = Bun.spawnSync([bun, "pm", "pack", "--destination", dest, "--quiet"], { cwd: pkgDir, stdout: "pipe", stderr: "pipe" });
  if (p.exitCode !== 0) throw new Error(`bun pm pack in ${pkgDir} failed:\n${p.stderr}`);
  const tarball = join(dest, basename(p.stdout.toString().trim().split("\n").at(-1)!));
  const t = listTarball(tarball);
  const manifest = JSON.parse(new TextDecoder().decode(t.read("package.json"))) as Json;
  return {
    name: manifest.name as string,
    version: manifest.version as string,
    dir: pkgDir,
    tarball,
    packedBytes: Bun.file(tarball).size,
    unpackedBytes: t.files.reduce((n, f) => n + f.size, 0),
    files: t.files,
    manifest,
  };
}

const TEST_PATH = /(^|\/)(test|tests|__tests__|__fixtures__|fixtures?|testdata)(\/|$)|\.(test|spec|bench)\.[cm]?[jt]sx?$|\.tmp\.[cm]?[jt]s$/i;

/** Every string target under an exports value (conditions and subpaths). */
function targets(node: unknown, at = ""): [string, string][] {
  if (typeof node === "string") return [[at || ".", node]];
  if (!node || typeof node !== "object") return [];
  return Object.entries(node as Json).flatMap(([k, v]) => targets(v, at ? `${at}.${k}` : k));
}

/** Problems with a packed package (empty: fine). */
export function checkTarball(p: Packed): string[] {
  const problems: string[] = [];
  const have = new Set(p.files.map((f) => f.path));
  const norm = (t: string) => t.replace(/^\.\//, "");
  const m = p.manifest;
  for (const f of p.files) if (TEST_PATH.test(f.path)) problems.push(`ships a test/fixture/scratch file: ${f.path}`);
  if (!have.has("README.md")) problems.push("no README.md");
  for (const field of ["dependencies", "optionalDependencies", "peerDependencies"]) {
    for (const [dep, range] of Object.entries((m[field] as Record<string, string>) ?? {})) {
      if (String(range).startsWith("workspace:")) problems.push(`${field}.${dep} is still ${range}`);
    }
  }
  const entries: [string, string][] = [...targets(m.exports)];
  for (const f of ["main", "types", "module"]) if (typeof m[f] === "string") entries.push([f, m[f] as string]);
  const bin = typeof m.bin === "string" ? { [String(m.name)]: m.bin } : ((m.bin as Record<string, string>) ?? {});
  for (const [k, v] of Object.entries(bin)) entries.push([`bin.${k}`, v]);
  for (const [where, t] of entries) {
    if (t.includes("*")) continue;
    if (!have.has(norm(t))) problems.push(`${where} → ${t} is not in the tarball`);
    if (!where.startsWith("bin.") && /\.tsx?$/.test(t) && !/\.d\.[cm]?ts$/.test(t)) problems.push(`${where} → ${t} is TypeScript source, not a built file`);
  }
  // Types for every JavaScript entry point of a library.
  const dot = (m.exports as Json | undefined)?.["."];
  if (dot !== undefined || m.main) {
    const typeTargets = [
      ...targets(dot)
        .filter(([k]) => k.endsWith("types"))
        .map(([, t]) => t),
      ...(typeof m.types === "string" ? [m.types] : []),
    ];
    if (typeTargets.length === 0) problems.push(`no types for the package's entry point`);
    for (const t of typeTargets) if (!/\.d\.[cm]?ts$/.test(t)) problems.push(`types → ${t} is not a .d.ts`);
  }
  // What the package exists for.
  const name = String(m.name);
  if (name.startsWith("@mlx-bun/native-")) {
    const ext = name.includes("darwin") ? "dylib" : "so";
    for (const f of [`libmlxb.${ext}`, `mlx/lib/libmlx.${ext}`, "licenses/MLX-LICENSE", "build-info.json"]) {
      if (!have.has(f)) problems.push(`native package without ${f}`);
    }
  }
  if (name === "@mlx-bun/tiny-model") {
    for (const f of ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]) {
      if (!have.has(`model/${f}`)) problems.push(`no model/${f}`);
    }
  }
  return problems;
}

export const mb = (n: number) => `${(n / 1e6).toFixed(n < 1e6 ? 2 : 1)} MB`;

/** One line per file, for the CI log. */
export function listing(p: Packed, max = 40): string {
  const files = [...p.files].sort((a, b) => a.path.localeCompare(b.path));
  const shown = files.slice(0, max).map((f) => `    ${f.path}  ${f.size >= 1e5 ? mb(f.size) : `${f.size} B`}`);
  if (files.length > max) shown.push(`    … ${files.length - max} more`);
  return shown.join("\n");
}

if (import.meta.main) {
  const dest = mkdtempSync(join(tmpdir(), "mlx-bun-pack-"));
  let bad = 0;
  for (const dir of process.argv.slice(2)) {
    if (!existsSync(join(dir, "package.json"))) continue;
    const p = packPackage(dir, dest);
    const problems = checkTarball(p);
    bad += problems.length;
    console.log(`${p.name}@${p.version}: ${p.files.length} files, ${mb(p.packedBytes)} packed, ${mb(p.unpackedBytes)} unpacked\n${listing(p)}`);
    for (const x of problems) console.log(`  ✗ ${x}`);
  }
  console.log(`tarballs in ${dest}`);
  process.exit(bad ? 1 : 0);
}
