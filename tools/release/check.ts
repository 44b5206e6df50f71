// The release check (.ci/run calls it): the whole release flow against a real npm registry started
// here, then installs from that registry the way a user would, and compares tokens.
//
//   1. build       `bun run build` (turbo: tsup dist/ + .d.ts for every package; cached after `bun run check`)
//   2. stage       a copy of the working tree in a temp folder (tracked + untracked files, never .git),
//                  with the built dist/, the web chat, and the set-up's tiny model copied into
//                  packages/tiny-model/model; prebuilt native package(s) filled for this machine
//                  (tools/release/build-native.ts)
//   3. version     `changeset version` in the copy: versions bumped per package, CHANGELOG.md written
//   4. pack        native packages with no prebuilt here are left out (private in the copy, dropped
//                  from mlx-ffi's optionalDependencies); the "bun" source condition is stripped;
//                  `bun pm pack` (workspace:* → exact versions); every tarball listed and checked
//                  (tools/release/pack.ts)
//   5. publish     Verdaccio on a free loopback port (tools/release/registry.ts); `changeset publish
//                  --from-pack-dir` with our tarballs, public access
//   6. consumer    a project in its own temp folder (own .npmrc, own Bun cache, own HOME, no
//                  workspace, no MLX_BUN_NATIVE/LD_LIBRARY_PATH): `bun add @mlx-bun/runtime ...`
//                  (timed), the runtime README's example run as written, the libmlx it maps is the
//                  prebuilt package's, exports resolve under Bun and under TypeScript's node16 and
//                  bundler resolution, and with the prebuilt removed the loader and the source
//                  build say what to do
//   7. cli         `bunx mlx-bun generate --json` and `bunx mlx-bun serve` from the registry
//                  against the in-repo CLI and server, same prompt, greedy: token ids (generate)
//                  and the whole choice with log-probabilities (serve) must be equal
//
//   bun tools/release/check.ts [--cuda] [--keep] [--json <file>]
//     --cuda   also build, pack and publish @mlx-bun/native-linux-x64-cuda13 (a 90 MB wheel download
//              on the first run, ~160 MB unpacked; not installed: no GPU here)
//     --keep   keep the temp folders (printed) instead of removing them
//     --json   write the measurements (sizes, times) to a file
import { createHash } from "node:crypto";
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative } from "node:path";
import { buildNativePackage, TARGETS } from "./build-native.ts";
import { checkTarball, listing, mb, type Packed, packPackage, preparePublishManifest } from "./pack.ts";
import { freePort, startRegistry } from "./registry.ts";

const root = join(import.meta.dir, "..", "..");
const bun = process.execPath;
// A folder holding `bun` (and nothing else that matters): the consumer's whole PATH, so no compiler,
// CMake or Python is reachable from it. The set-up's .native/bin; else the running Bun's folder.
const bunDir = existsSync(join(root, ".native/bin/bun")) ? join(root, ".native/bin") : dirname(bun);
const args = process.argv.slice(2);
const flag = (k: string) => args.includes(k);
const opt = (k: string) => (args.includes(k) ? args[args.indexOf(k) + 1] : undefined);
const pins = JSON.parse(readFileSync(join(root, "tools/setup/pins.json"), "utf8")) as Record<string, string>;

const t0 = performance.now();
const secs = (from: number) => ((performance.now() - from) / 1000).toFixed(1);
const say = (s: string) => console.log(`[release] ${s}`);
const step = (s: string) => console.log(`\n[release +${secs(t0)}s] ── ${s}`);
const metrics: Record<string, any> = { bun: Bun.version, mlx: pins.mlx };
let failures = 0;
const fail = (s: string) => {
  failures++;
  console.log(`[release] ✗ ${s}`);
};
const ok = (s: string) => console.log(`[release] ✓ ${s}`);

type Json = Record<string, any>;
const readJson = (p: string): Json => JSON.parse(readFileSync(p, "utf8"));
const writeJson = (p: string, v: unknown) => writeFileSync(p, `${JSON.stringify(v, null, 2)}\n`);

function run(cmd: string[], o: { cwd?: string; env?: Record<string, string | undefined>; timeoutMs?: number; input?: string } = {}) {
  const p = Bun.spawnSync(cmd, {
    cwd: o.cwd ?? root,
    env: (o.env ?? process.env) as Record<string, string>,
    stdout: "pipe",
    stderr: "pipe",
    stdin: o.input !== undefined ? new TextEncoder().encode(o.input) : "ignore",
    timeout: o.timeoutMs ?? 300_000,
  });
  return { code: p.exitCode ?? -1, out: p.stdout.toString(), err: p.stderr.toString() };
}
function must(cmd: string[], o: Parameters<typeof run>[1] = {}, what = cmd.join(" ")) {
  const r = run(cmd, o);
  if (r.code !== 0) throw new Error(`${what} failed (exit ${r.code}):\n${r.out.slice(-3000)}\n${r.err.slice(-3000)}`);
  return r;
}
const indent = (s: string, n = 4) =>
  s
    .trimEnd()
    .split("\n")
    .map((l) => " ".repeat(n) + l)
    .join("\n");

const work = mkdtempSync(join(tmpdir(), "mlx-bun-release-"));
const copy = join(work, "repo");
const packDir = join(work, "pack");
const regDir = join(work, "registry");
let stopRegistry: (() => Promise<void>) | undefined;
const servers: Bun.Subprocess[] = [];

async function main() {
  say(`work folder ${work}`);
  // ── 1. build
  step("1. build (turbo: tsup dist/ and types)");
  for (const need of [".native/venv/bin/python", ".native/models/tiny-gemma4/config.json", "apps/mlx-bun/web/dist/index.html"]) {
    if (!existsSync(join(root, need))) throw new Error(`${need} is missing: run bash tools/setup.sh first`);
  }
  let t = performance.now();
  must(["bash", "tools/turbo.sh", "run", "build", "--output-logs=errors-only"], {}, "bun run build");
  say(`built in ${secs(t)}s`);

  // ── 2. stage
  step("2. stage a copy of the working tree");
  t = performance.now();
  const files = must(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]).out.split("\0").filter(Boolean);
  for (const f of files) {
    const from = join(root, f);
    if (!existsSync(from)) continue; // deleted in the work tree
    mkdirSync(dirname(join(copy, f)), { recursive: true });
    cpSync(from, join(copy, f), { dereference: false });
  }
  const pkgDirs = [...readdirSync(join(copy, "packages")).map((d) => `packages/${d}`), "apps/mlx-bun"].filter((d) => existsSync(join(copy, d, "package.json")));
  for (const d of pkgDirs) if (existsSync(join(root, d, "dist"))) cpSync(join(root, d, "dist"), join(copy, d, "dist"), { recursive: true });
  cpSync(join(root, "apps/mlx-bun/web/dist"), join(copy, "apps/mlx-bun/web/dist"), { recursive: true });
  mkdirSync(join(copy, "packages/tiny-model/model"), { recursive: true });
  for (const f of readdirSync(join(root, ".native/models/tiny-gemma4"))) {
    if (!f.startsWith(".")) cpSync(join(root, ".native/models/tiny-gemma4", f), join(copy, "packages/tiny-model/model", f));
  }
  say(`${files.length} files copied in ${secs(t)}s`);
  // Prebuilt native packages: what this machine can build.
  const host = `${process.platform}-${process.arch}`;
  const buildable = Object.keys(TARGETS).filter(
    (k) => (k === host || (flag("--cuda") && k === `${host}-cuda13`)) && existsSync(join(copy, "packages", `native-${k}`)),
  );
  const nativeSizes: Record<string, number> = {};
  for (const target of buildable) {
    t = performance.now();
    const r = buildNativePackage(target, join(copy, "packages", `native-${target}`));
    nativeSizes[target] = r.bytes;
    ok(`@mlx-bun/native-${target}: ${mb(r.bytes)} in ${secs(t)}s (${r.check})`);
  }
  must([bun, "install"], { cwd: copy }, "bun install (copy)");

  // ── 3. version
  step("3. changeset version");
  const versionsOf = () => Object.fromEntries(pkgDirs.map((d) => readJson(join(copy, d, "package.json"))).map((p) => [p.name as string, p.version as string]));
  const before = versionsOf();
  const known = new Set(Object.keys(before));
  for (const f of readdirSync(join(copy, ".changeset")).filter((f) => f.endsWith(".md") && f !== "README.md")) {
    const front = /^---\n([\s\S]*?)\n---/.exec(readFileSync(join(copy, ".changeset", f), "utf8"))?.[1] ?? "";
    for (const m of front.matchAll(/^["']?([^"':]+)["']?\s*:/gm)) {
      if (!known.has(m[1]!)) {
        throw new Error(
          `.changeset/${f} names ${m[1]}, which is no workspace package${m[1] === "@mlx-bun/mlx-bun" ? " (the app is published as `mlx-bun` now)" : ""}`,
        );
      }
    }
  }
  const changesets = readdirSync(join(copy, ".changeset")).filter((f) => f.endsWith(".md") && f !== "README.md").length;
  const cs = join(copy, "node_modules/@changesets/cli/bin.js");
  must([bun, cs, "version"], { cwd: copy }, "changeset version");
  const after = versionsOf();
  const bumped = Object.keys(after).filter((n) => after[n] !== before[n]);
  say(`${changesets} changesets → ${bumped.length} packages bumped:`);
  for (const n of Object.keys(after).sort()) {
    const log = pkgDirs.map((d) => join(copy, d)).find((d) => readJson(join(d, "package.json")).name === n);
    const changelog = log && existsSync(join(log, "CHANGELOG.md")) ? "CHANGELOG.md" : "no changelog";
    say(`    ${n.padEnd(34)} ${before[n]} → ${after[n]}${after[n] === before[n] ? " (unchanged)" : ""}  ${changelog}`);
  }
  metrics.versions = after;

  // ── 4. pack
  step("4. pack (bun pm pack) and check each tarball");
  const mlxFfi = join(copy, "packages/mlx-ffi/package.json");
  const ffi = readJson(mlxFfi);
  const skipped: string[] = [];
  for (const d of pkgDirs.filter((d) => /packages\/native-/.test(d))) {
    const target = d.replace("packages/native-", "");
    if (buildable.includes(target)) continue;
    const pj = readJson(join(copy, d, "package.json"));
    pj.private = true;
    writeJson(join(copy, d, "package.json"), pj);
    if (ffi.optionalDependencies?.[pj.name]) delete ffi.optionalDependencies[pj.name];
    skipped.push(pj.name);
  }
  writeJson(mlxFfi, ffi);
  say(`not published here (no prebuilt on ${host}; built by their own CI jobs, docs/release.md): ${skipped.join(", ")}`);
  const publishable = pkgDirs.filter((d) => !readJson(join(copy, d, "package.json")).private);
  mkdirSync(join(packDir, "packages"), { recursive: true });
  const packed: Packed[] = [];
  let packBad = 0;
  t = performance.now();
  for (const d of publishable) {
    const changes = preparePublishManifest(join(copy, d));
    const p = packPackage(join(copy, d), join(packDir, "packages"), bun);
    packed.push(p);
    const problems = checkTarball(p);
    packBad += problems.length;
    console.log(
      `  ${p.name}@${p.version}: ${p.files.length} files, ${mb(p.packedBytes)} packed, ${mb(p.unpackedBytes)} unpacked${changes.length ? ` (publish manifest: ${changes.join("; ")})` : ""}`,
    );
    console.log(listing(p, 12));
    for (const x of problems) fail(`${p.name}: ${x}`);
  }
  say(`${packed.length} tarballs in ${secs(t)}s`);
  if (packBad === 0) ok("tarballs: no tests or fixtures, every exports/main/types/bin target packed, types present, no workspace: ranges");
  metrics.packages = Object.fromEntries(
    packed.map((p) => [p.name, { version: p.version, files: p.files.length, packed: p.packedBytes, unpacked: p.unpackedBytes }]),
  );
  if (packBad) throw new Error(`${packBad} problems in the tarballs`);

  // ── 5. publish
  step(`5. publish: changeset publish to Verdaccio ${pins.verdaccio}`);
  t = performance.now();
  const reg = await startRegistry(regDir, say);
  stopRegistry = reg.stop;
  say(`registry ${reg.url} (storage ${relative(work, regDir)}/storage), up in ${secs(t)}s`);
  const npmrc = join(work, "publisher.npmrc");
  writeFileSync(npmrc, reg.npmrc);
  const pubEnv = { ...process.env, NPM_CONFIG_USERCONFIG: npmrc, NPM_CONFIG_REGISTRY: reg.url, npm_config_registry: reg.url, CI: "true" };
  t = performance.now();
  must([bun, cs, "publish-plan", "--output", join(packDir, "plan.json")], { cwd: copy, env: pubEnv }, "changeset publish-plan");
  const plan = readJson(join(packDir, "plan.json"));
  for (const chunk of plan.plan as Json[][]) {
    for (const rel of chunk) {
      if (rel.kind !== "publish") continue;
      const p = packed.find((x) => x.name === rel.name && x.version === rel.version);
      if (!p) throw new Error(`the publish plan has ${rel.name}@${rel.version}, which was not packed`);
      rel.tarball = {
        path: `packages/${p.tarball.split("/").at(-1)}`,
        integrity: `sha256-${createHash("sha256").update(readFileSync(p.tarball)).digest("base64")}`,
      };
    }
  }
  writeJson(join(packDir, "publish-plan.json"), plan);
  const pub = run([bun, cs, "publish", "--from-pack-dir", packDir, "--no-git-tag"], { cwd: copy, env: pubEnv, timeoutMs: 600_000 });
  console.log(
    indent(
      (pub.out + pub.err)
        .replace(/\x1b\[[0-9;]*m/g, "")
        .split("\n")
        .filter((l) => /published|@|error|fail/i.test(l))
        .join("\n"),
    ),
  );
  if (pub.code !== 0) throw new Error(`changeset publish failed (exit ${pub.code})`);
  const published: string[] = [];
  for (const p of packed) {
    const r = await fetch(`${reg.url}${p.name.replace("/", "%2f")}`);
    const doc = r.ok ? ((await r.json()) as Json) : {};
    if (doc.versions?.[p.version]) published.push(`${p.name}@${p.version}`);
    else fail(`${p.name}@${p.version} is not in the registry after publish`);
  }
  ok(`published ${published.length}/${packed.length} packages (public access) in ${secs(t)}s`);
  metrics.publishSeconds = Number(secs(t));

  // ── 6. consumer project
  step("6. consumer project: bun add @mlx-bun/runtime from the registry (PATH: bun only)");
  const consumer = join(work, "consumer");
  const home = join(work, "home");
  mkdirSync(consumer, { recursive: true });
  mkdirSync(join(home, ".cache"), { recursive: true });
  const cache = join(work, "bun-cache");
  const cleanEnv = (extra: Record<string, string> = {}): Record<string, string> => ({
    PATH: bunDir,
    HOME: home,
    TMPDIR: join(work, "tmp"),
    BUN_INSTALL_CACHE_DIR: cache,
    NO_COLOR: "1",
    ...extra,
  });
  mkdirSync(join(work, "tmp"), { recursive: true });
  writeFileSync(join(consumer, ".npmrc"), `registry=${reg.url}\n`);
  // bunx reads the user's ~/.npmrc (or $NPM_CONFIG_REGISTRY), not the current folder's.
  writeFileSync(join(home, ".npmrc"), `registry=${reg.url}\n`);
  writeJson(join(consumer, "package.json"), { name: "mlx-bun-consumer", private: true, type: "module" });
  t = performance.now();
  const add = run([bun, "add", "@mlx-bun/runtime", "@mlx-bun/kv-cache", "@mlx-bun/tiny-model"], { cwd: consumer, env: cleanEnv() });
  const installSeconds = Number(secs(t));
  if (add.code !== 0) throw new Error(`bun add failed:\n${add.out}\n${add.err}`);
  console.log(
    indent(
      add.out
        .split("\n")
        .filter((l) => /installed|^\s*\+/.test(l))
        .join("\n"),
    ),
  );
  ok(`bun add @mlx-bun/runtime @mlx-bun/kv-cache @mlx-bun/tiny-model: ${installSeconds}s (empty Bun cache, registry proxying npmjs for third-party packages)`);
  const nm = join(consumer, "node_modules");
  metrics.consumerInstallSeconds = installSeconds;
  metrics.consumerNodeModulesBytes = Number(must(["du", "-sb", nm]).out.split(/\s/)[0]);
  say(`node_modules: ${mb(metrics.consumerNodeModulesBytes as number)} on disk`);

  // The runtime README's example, as written.
  const readme = readFileSync(join(nm, "@mlx-bun/runtime/README.md"), "utf8");
  const example = /## Example\s+```ts\n([\s\S]*?)```/.exec(readme)?.[1];
  if (!example) throw new Error("no ```ts block under ## Example in @mlx-bun/runtime's README");
  writeFileSync(join(consumer, "example.ts"), example);
  t = performance.now();
  const ex = run([bun, "example.ts"], { cwd: consumer, env: cleanEnv(), timeoutMs: 180_000 });
  if (ex.code === 0) ok(`runtime README example ran (${secs(t)}s); its output:\n${indent(ex.out.slice(0, 600))}`);
  else fail(`runtime README example failed (exit ${ex.code}):\n${indent(ex.err.slice(-2000))}`);

  // Which native library the installed packages load.
  writeFileSync(
    join(consumer, "which-native.ts"),
    `import { mlxVersion, resolveLibraryPath } from "@mlx-bun/mlx-ffi";
const v = mlxVersion();
const maps = require("node:fs").readFileSync("/proc/self/maps", "utf8");
const libmlx = [...new Set(maps.split("\\n").filter((l: string) => /libmlx\\.so/.test(l)).map((l: string) => l.split(/\\s+/).at(-1)))];
console.log(JSON.stringify({ v, libmlxb: resolveLibraryPath(), libmlx }));\n`,
  );
  const wn = run([bun, "which-native.ts"], { cwd: consumer, env: cleanEnv() });
  if (wn.code !== 0) fail(`loading the native library from the installed packages failed:\n${indent(wn.err)}`);
  else {
    const w = JSON.parse(wn.out.trim().split("\n").at(-1)!) as { v: string; libmlxb: string; libmlx: string[] };
    const inside = (p: string) => p.startsWith(nm) && p.includes(`native-${host}`);
    if (inside(w.libmlxb) && w.libmlx.length > 0 && w.libmlx.every(inside)) {
      ok(
        `native library from the prebuilt package, no compiler: libmlxb ${relative(consumer, w.libmlxb)}, libmlx ${relative(consumer, w.libmlx[0]!)} (MLX ${w.v})`,
      );
    } else fail(`native library not from the prebuilt package: ${wn.out}`);
  }

  // exports under Bun, and under TypeScript's node16 and bundler resolution.
  const names = packed.map((p) => p.name).filter((n) => n.startsWith("@mlx-bun/") && !n.startsWith("@mlx-bun/native-"));
  t = performance.now();
  must(
    [bun, "add", "@mlx-bun/mlx-ffi", "@mlx-bun/mlx-ops", "@mlx-bun/models", "-d", `@types/bun@${pins.bun}`],
    { cwd: consumer, env: cleanEnv() },
    "bun add (type check deps)",
  );
  say(`bun add @mlx-bun/mlx-ffi @mlx-bun/mlx-ops @mlx-bun/models -d @types/bun: ${secs(t)}s`);
  writeFileSync(
    join(consumer, "resolve.ts"),
    `const out: Record<string, string> = {};\nfor (const n of ${JSON.stringify(names)}) { out[n] = import.meta.resolve(n); await import(n); }\nconsole.log(JSON.stringify(out));\n`,
  );
  const rs = run([bun, "resolve.ts"], { cwd: consumer, env: cleanEnv() });
  if (rs.code !== 0) fail(`import under Bun failed:\n${indent(rs.err)}`);
  else {
    const res = JSON.parse(rs.out.trim().split("\n").at(-1)!) as Record<string, string>;
    const bad = Object.entries(res).filter(([, u]) => !/\/dist\/index\.js$/.test(u));
    if (bad.length) fail(`Bun resolved to files other than dist/index.js: ${JSON.stringify(bad)}`);
    else ok(`Bun: ${names.length} packages import, each resolving to dist/index.js`);
  }
  writeFileSync(
    join(consumer, "types.ts"),
    `import { Engine, Scheduler, type GenerateRequest, type GenerationResult } from "@mlx-bun/runtime";
import { KVCache } from "@mlx-bun/kv-cache";
import { MlxArray, type Dtype } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { loadModel } from "@mlx-bun/models";
import { tinyModelDir } from "@mlx-bun/tiny-model";
const req: GenerateRequest = { promptIds: [2, 3], maxTokens: 4 };
export async function first(engine: Engine): Promise<GenerationResult> { return engine.generate(req).result; }
const dt: Dtype = "bfloat16";
export const used = [Scheduler, KVCache, MlxArray, mx, loadModel, tinyModelDir.length, dt];
`,
  );
  const tsc = join(root, "node_modules/typescript/bin/tsc");
  const modes = [
    ["node16", "node16"],
    ["bundler", "esnext"],
  ] as const;
  for (const [mode, module] of modes) {
    writeJson(join(consumer, `tsconfig.${mode}.json`), {
      compilerOptions: {
        target: "es2022",
        lib: ["ES2023", "ESNext.Disposable"],
        module,
        moduleResolution: mode,
        types: ["bun"],
        strict: true,
        noEmit: true,
        skipLibCheck: false,
      },
      files: ["types.ts"],
    });
  }
  // Both at once: each is ~20 s of checking @types/bun and our declarations.
  t = performance.now();
  const tscRuns = await Promise.all(
    modes.map(async ([mode]) => {
      const p = Bun.spawn([bun, tsc, "-p", `tsconfig.${mode}.json`], { cwd: consumer, env: cleanEnv(), stdout: "pipe", stderr: "pipe" });
      const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
      return { mode, out, err, code };
    }),
  );
  for (const r of tscRuns) {
    const mode = r.mode;
    // Errors in our files fail the check; errors inside third-party declarations are reported only.
    const errs = (r.out + r.err).split("\n").filter((l) => /error TS\d+/.test(l));
    const ours = errs.filter((l) => l.startsWith("types.ts") || l.includes("node_modules/@mlx-bun/") || l.includes("node_modules/mlx-bun/"));
    const theirs = [...new Set(errs.filter((l) => !ours.includes(l)).map((l) => l.split("(")[0]))];
    if (ours.length === 0 && (r.code === 0 || theirs.length > 0)) {
      ok(
        `TypeScript moduleResolution ${mode} (${secs(t)}s): the packages' types resolve and check (skipLibCheck off)${theirs.length ? `; third-party declarations with errors of their own: ${theirs.join(", ")}` : ""}`,
      );
      if (theirs.length) (metrics.typescriptThirdParty ??= {} as Json)[mode] = theirs;
    } else fail(`TypeScript moduleResolution ${mode}:\n${indent((ours.length ? ours : errs).join("\n").slice(0, 3000) || r.out + r.err)}`);
  }

  // No prebuilt: the loader's message, and the source build's message without a toolchain.
  const nativeLib = JSON.parse(
    run([bun, "-e", `import { prebuiltCandidates } from "@mlx-bun/mlx-ffi"; console.log(JSON.stringify(prebuiltCandidates()))`], {
      cwd: consumer,
      env: cleanEnv(),
    }).out.trim() || "[]",
  ) as string[];
  const nativeDir = nativeLib[0] ? dirname(nativeLib[0]) : undefined;
  if (nativeDir) {
    renameSync(nativeDir, `${nativeDir}.hidden`);
    try {
      const nl = run([bun, "-e", `import { mlxVersion } from "@mlx-bun/mlx-ffi"; mlxVersion();`], { cwd: consumer, env: cleanEnv({ MLX_BUN_BACKEND: "cpu" }) });
      const msg = /NativeLibraryError: (.*)/.exec(nl.err)?.[1] ?? nl.err.trim();
      if (nl.code !== 0 && /build it from source/.test(msg)) ok(`without the prebuilt: ${msg.replace(/\(looked in: [^)]*\)/, "(looked in: …)")}`);
      else fail(`without the prebuilt the loader said: ${nl.err.slice(-600)}`);
      // The command the loader's message names: <mlx-ffi>/dist/build-native.js.
      const ffiIndex = JSON.parse(
        run([bun, "-e", `console.log(JSON.stringify(require.resolve("@mlx-bun/mlx-ffi")))`], { cwd: consumer, env: cleanEnv() }).out.trim(),
      ) as string;
      const nb = run([bun, join(dirname(ffiIndex), "build-native.js")], { cwd: consumer, env: cleanEnv() });
      if (nb.code !== 0 && /Missing:/.test(nb.err)) ok(`source build with no toolchain on PATH:\n${indent(nb.err)}`);
      else fail(`the source build without a toolchain said (exit ${nb.code}): ${nb.err.slice(-600)}`);
    } finally {
      renameSync(`${nativeDir}.hidden`, nativeDir);
    }
  } else fail("no prebuilt package found from the consumer project");

  // ── 7. the CLI from the registry against the in-repo CLI
  step("7. bunx mlx-bun (generate, serve) against the in-repo CLI");
  const prompt = "Write a haiku about the sea.";
  const gen = ["generate", "--json", "--prompt", prompt, "--max-tokens", "24", "--temp", "0"];
  const repoEnv = { ...process.env };
  delete repoEnv.MLX_BUN_NATIVE;
  t = performance.now();
  const ref = must([bun, "apps/mlx-bun/src/cli.ts", ...gen], { env: repoEnv }, "in-repo mlx-bun generate");
  const refJson = JSON.parse(ref.out.trim().split("\n").at(-1)!) as Json;
  const bx = join(work, "bunx");
  mkdirSync(bx, { recursive: true });
  t = performance.now();
  // Its own empty Bun cache: the time below is a first `bunx mlx-bun` (install of the CLI and its
  // 150-odd dependencies included); serve later reuses it.
  const bxEnv = cleanEnv({ BUN_INSTALL_CACHE_DIR: join(work, "bunx-cache") });
  const bxr = run([bun, "x", "mlx-bun", ...gen], { cwd: bx, env: bxEnv, timeoutMs: 300_000 });
  metrics.bunxGenerateSeconds = Number(secs(t));
  if (bxr.code !== 0) fail(`bunx mlx-bun generate failed (exit ${bxr.code}):\n${indent(bxr.err.slice(-2000))}`);
  else {
    const got = JSON.parse(bxr.out.trim().split("\n").at(-1)!) as Json;
    say(`bunx mlx-bun ${gen.join(" ")}  (${secs(t)}s: first bunx, empty cache, install included)`);
    say(`    model ${got.model}, prompt ${got.prompt_ids.length} tokens`);
    say(`    in-repo  ids ${JSON.stringify(refJson.generated_ids)}`);
    say(`    registry ids ${JSON.stringify(got.generated_ids)}`);
    if (
      JSON.stringify(got.generated_ids) === JSON.stringify(refJson.generated_ids) &&
      JSON.stringify(got.prompt_ids) === JSON.stringify(refJson.prompt_ids) &&
      got.text === refJson.text
    ) {
      ok(`generate: ${got.generated_ids.length} generated token ids equal (prompt ids and text too)`);
    } else fail("generate: tokens differ between bunx mlx-bun and the in-repo CLI");
  }

  // serve: both servers, one greedy chat request with log-probabilities, choices compared.
  const request = { model: "tiny-gemma4", messages: [{ role: "user", content: prompt }], max_tokens: 24, temperature: 0, logprobs: true, top_logprobs: 2 };
  const serveOnce = async (cmd: string[], cwd: string, env: Record<string, string | undefined>, label: string) => {
    const port = await freePort();
    const proc = Bun.spawn([...cmd, "serve", "--port", String(port), "--no-log"], { cwd, env: env as Record<string, string>, stdout: "pipe", stderr: "pipe" });
    servers.push(proc);
    const url = `http://127.0.0.1:${port}`;
    const deadline = Date.now() + 180_000;
    for (;;) {
      try {
        if ((await fetch(`${url}/health`)).ok) break;
      } catch {
        // not yet
      }
      if (proc.exitCode !== null || Date.now() > deadline) throw new Error(`${label} serve did not come up: ${await new Response(proc.stderr).text()}`);
      await Bun.sleep(200);
    }
    const web = await fetch(`${url}/`);
    const page = web.ok && (web.headers.get("content-type") ?? "").includes("text/html");
    const r = (await (
      await fetch(`${url}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(request) })
    ).json()) as Json;
    proc.kill();
    await proc.exited;
    return { r, page };
  };
  t = performance.now();
  const a = await serveOnce([bun, "apps/mlx-bun/src/cli.ts"], root, repoEnv, "in-repo");
  const b = await serveOnce([bun, "x", "mlx-bun"], bx, bxEnv, "bunx");
  const strip = (r: Json) => ({ choices: r.choices, usage: r.usage });
  say(`bunx mlx-bun serve: POST /v1/chat/completions (greedy, logprobs) (${secs(t)}s for both servers)`);
  say(`    in-repo  ${JSON.stringify(a.r.choices?.[0]?.message?.content)}  usage ${JSON.stringify(a.r.usage)}`);
  say(`    registry ${JSON.stringify(b.r.choices?.[0]?.message?.content)}  usage ${JSON.stringify(b.r.usage)}`);
  if (!b.r.choices) fail(`serve: no choices: ${JSON.stringify(b.r).slice(0, 500)}`);
  else if (JSON.stringify(strip(a.r)) === JSON.stringify(strip(b.r))) {
    ok(`serve: the choice (${b.r.usage?.completion_tokens} tokens with their log-probabilities) and usage equal the in-repo server's`);
  } else fail("serve: the responses differ between bunx mlx-bun serve and the in-repo server");
  if (b.page) ok("serve: the web chat page is served from the published package (GET / → text/html)");
  else fail("serve: GET / did not return the web chat page");
}

try {
  await main();
} catch (e) {
  fail(e instanceof Error ? e.message : String(e));
} finally {
  for (const s of servers) s.kill();
  await stopRegistry?.();
  metrics.totalSeconds = Number(secs(t0));
  const jsonOut = opt("--json");
  if (jsonOut) writeJson(jsonOut, metrics);
  if (flag("--keep")) say(`kept ${work}`);
  else rmSync(work, { recursive: true, force: true });
  console.log(`\n[release] ${failures === 0 ? "release check passed" : `release check FAILED (${failures})`} in ${secs(t0)}s`);
  process.exit(failures === 0 ? 0 : 1);
}
