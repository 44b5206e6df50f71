// Fill a prebuilt @mlx-bun/native-<target> package: libmlxb (the CMake target mlxb_prebuilt, rpath
// $ORIGIN/mlx/lib) plus the MLX wheel's own shared libraries laid out as in site-packages, so the
// wheel's libmlx finds its vendored libraries through its own rpath, unmodified:
//   <pkg>/libmlxb.so                 ours, built against the wheel's headers
//   <pkg>/mlx/lib/libmlx.so          the wheel's (Metal: libmlx.dylib + mlx.metallib)
//   <pkg>/mlx_cpu.libs/*             the wheel's auditwheel-vendored BLAS/LAPACK/gfortran/quadmath
//   <pkg>/licenses/                  the wheel's LICENSE and SBOM
//   <pkg>/build-info.json            versions, hashes, sizes, glibc/libstdc++ floor
//
//   bun tools/release/build-native.ts --target linux-x64 [--out <dir>]    (default: packages/native-<target>)
//
// Targets and where they build (docs/release.md):
//   linux-x64, linux-arm64   on that architecture, from the venv's mlx-cpu wheel (tools/setup.sh)
//   linux-x64-cuda13         on Linux x64, from the mlx-cuda-13 wheel (pip download --no-deps, cached
//                            in .native/release/wheels); no nvcc needed: libmlxb is the CPU build's
//                            binary, checked to need only symbols the CUDA libmlx exports, against
//                            headers checked identical
//   darwin-arm64             on macOS arm64, from the venv's mlx-metal wheel (not run on Linux CI)
import { createHash } from "node:crypto";
import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { basename, dirname, join, relative } from "node:path";

const root = join(import.meta.dir, "..", "..");
const pins = JSON.parse(readFileSync(join(root, "tools/setup/pins.json"), "utf8")) as Record<string, string>;
const venvPython = join(root, ".native/venv/bin/python");
const nativeSrc = join(root, "packages/mlx-ffi/native");

export interface Target {
  /** the wheel that holds libmlx (PyPI name) */
  wheel: string;
  /** the wheel's vendored-library folder beside mlx/ (auditwheel), or none */
  libs?: string;
  host: { platform: NodeJS.Platform; arch: string };
  /** where the wheel comes from: the set-up's venv, or downloaded */
  source: "venv" | "download";
  ext: "so" | "dylib";
}

export const TARGETS: Record<string, Target> = {
  "linux-x64": { wheel: "mlx-cpu", libs: "mlx_cpu.libs", host: { platform: "linux", arch: "x64" }, source: "venv", ext: "so" },
  "linux-arm64": { wheel: "mlx-cpu", libs: "mlx_cpu.libs", host: { platform: "linux", arch: "arm64" }, source: "venv", ext: "so" },
  "linux-x64-cuda13": { wheel: "mlx-cuda-13", libs: "mlx_cuda_13.libs", host: { platform: "linux", arch: "x64" }, source: "download", ext: "so" },
  "darwin-arm64": { wheel: "mlx-metal", host: { platform: "darwin", arch: "arm64" }, source: "venv", ext: "dylib" },
};

const say = (s: string) => console.log(`[build-native] ${s}`);

function sh(cmd: string[], opts: { cwd?: string; quiet?: boolean } = {}): string {
  const p = Bun.spawnSync(cmd, { cwd: opts.cwd ?? root, stdout: "pipe", stderr: "pipe" });
  if (p.exitCode !== 0) throw new Error(`${cmd.join(" ")} failed (${p.exitCode}):\n${p.stdout}${p.stderr}`);
  return p.stdout.toString();
}

const sha256 = (file: string) => createHash("sha256").update(readFileSync(file)).digest("hex");
const distName = (wheel: string) => wheel.replaceAll("-", "_");

/** A wheel's files as installed or unpacked: site dir, dist-info dir, and its RECORD paths. */
interface WheelTree {
  site: string;
  distInfo: string;
  files: string[];
  wheelFile?: string;
  wheelSha256?: string;
}

function readRecord(site: string, wheel: string, version: string): WheelTree {
  const distInfo = join(site, `${distName(wheel)}-${version}.dist-info`);
  if (!existsSync(distInfo)) throw new Error(`${wheel}==${version} is not in ${site} (no ${basename(distInfo)}); run bash tools/setup.sh`);
  const files = readFileSync(join(distInfo, "RECORD"), "utf8")
    .split("\n")
    .map((l) => l.split(",")[0]!)
    .filter(Boolean);
  return { site, distInfo, files };
}

function venvTree(wheel: string, version: string): WheelTree {
  const site = sh([venvPython, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"]).trim();
  return readRecord(site, wheel, version);
}

/** Download (once) and unpack a wheel for Linux x64 into .native/release/wheels. */
function downloadedTree(wheel: string, version: string): WheelTree {
  const dir = join(root, ".native/release/wheels");
  mkdirSync(dir, { recursive: true });
  const prefix = `${distName(wheel)}-${version}-`;
  let file = readdirSync(dir).find((f) => f.startsWith(prefix) && f.endsWith(".whl"));
  if (!file) {
    say(`pip download --no-deps ${wheel}==${version}`);
    sh([
      venvPython,
      "-m",
      "pip",
      "download",
      "-q",
      "--disable-pip-version-check",
      "--no-deps",
      "--only-binary=:all:",
      "--platform",
      "manylinux_2_35_x86_64",
      "-d",
      dir,
      `${wheel}==${version}`,
    ]);
    file = readdirSync(dir).find((f) => f.startsWith(prefix) && f.endsWith(".whl"));
    if (!file) throw new Error(`pip download gave no ${prefix}*.whl`);
  }
  const site = join(dir, file.replace(/\.whl$/, ""));
  if (!existsSync(join(site, ".unpacked"))) {
    rmSync(site, { recursive: true, force: true });
    sh([venvPython, "-m", "zipfile", "-e", join(dir, file), site]);
    writeFileSync(join(site, ".unpacked"), "");
  }
  return { ...readRecord(site, wheel, version), wheelFile: file, wheelSha256: sha256(join(dir, file)) };
}

/** Build the CMake target mlxb_prebuilt against the MLX at cmakeDir; returns the library's path. */
function buildPrebuilt(cmakeDir: string, ext: string): string {
  // The set-up's build tree when it is configured against the same MLX (only a link: the objects are
  // shared with the set-up's libmlxb), else a tree of its own.
  const setupBuild = join(nativeSrc, "build");
  const cache = existsSync(join(setupBuild, "CMakeCache.txt")) ? readFileSync(join(setupBuild, "CMakeCache.txt"), "utf8") : "";
  const build =
    cache.includes(`MLX_DIR:PATH=${cmakeDir}\n`) || cache.includes(`MLX_DIR:UNINITIALIZED=${cmakeDir}\n`) ? setupBuild : join(nativeSrc, "build-prebuilt");
  if (build !== setupBuild || !cache) sh(["cmake", "-S", nativeSrc, "-B", build, "-DCMAKE_BUILD_TYPE=Release", `-DMLX_DIR=${cmakeDir}`]);
  else sh(["cmake", "-S", nativeSrc, "-B", build]); // picks up a CMakeLists.txt that predates mlxb_prebuilt
  say(`cmake --build ${relative(root, build)} --target mlxb_prebuilt`);
  sh(["cmake", "--build", build, "--target", "mlxb_prebuilt", "--parallel", String(navigator.hardwareConcurrency || 2)]);
  const lib = join(build, "prebuilt", `libmlxb.${ext}`);
  if (!existsSync(lib)) throw new Error(`no ${lib} after the build`);
  return lib;
}

/** Highest GLIBC_ / GLIBCXX_ symbol versions a shared library asks for (Linux). */
function symbolFloor(files: string[]): { glibc: string; glibcxx: string } {
  const vers = { glibc: "0", glibcxx: "0" };
  const cmp = (a: string, b: string) => {
    const x = a.split(".").map(Number);
    const y = b.split(".").map(Number);
    for (let i = 0; i < Math.max(x.length, y.length); i++) if ((x[i] ?? 0) !== (y[i] ?? 0)) return (x[i] ?? 0) - (y[i] ?? 0);
    return 0;
  };
  for (const f of files) {
    const out = sh(["objdump", "-T", f]);
    for (const m of out.matchAll(/\((GLIBC|GLIBCXX)_([0-9.]+)\)/g)) {
      const k = m[1] === "GLIBC" ? "glibc" : "glibcxx";
      if (cmp(m[2]!, vers[k]) > 0) vers[k] = m[2]!;
    }
  }
  return vers;
}

/** The CUDA package reuses the CPU-built libmlxb: check the headers match and every MLX symbol it needs exists. */
function checkAbiAgainst(libmlxb: string, libmlx: string, cudaInclude: string, cpuInclude: string): string {
  const list = (d: string): string[] =>
    readdirSync(d, { recursive: true, withFileTypes: true })
      .filter((e) => e.isFile())
      .map((e) => relative(d, join(e.parentPath, e.name)));
  const cpu = list(cpuInclude);
  const differ = cpu.filter((f) => !existsSync(join(cudaInclude, f)) || sha256(join(cudaInclude, f)) !== sha256(join(cpuInclude, f)));
  if (differ.length) throw new Error(`MLX headers differ between the CPU and CUDA wheels: ${differ.slice(0, 5).join(", ")}`);
  const undef = sh(["nm", "-D", "--undefined-only", libmlxb])
    .split("\n")
    .map((l) => l.trim().split(/\s+/).at(-1)!)
    .filter((s) => s?.includes("mlx"));
  const defined = new Set(
    sh(["nm", "-D", "--defined-only", libmlx])
      .split("\n")
      .map((l) => l.trim().split(/\s+/).at(-1)),
  );
  const missing = undef.filter((s) => !defined.has(s));
  if (missing.length) throw new Error(`${basename(libmlx)} lacks ${missing.length} symbols libmlxb needs, e.g. ${missing[0]}`);
  return `headers identical (${cpu.length} files), ${undef.length} MLX symbols of libmlxb all exported by the CUDA libmlx.so`;
}

/** Load the package's libmlxb in a clean process (no LD_LIBRARY_PATH) and report which libmlx it mapped. */
function loadCheck(pkgDir: string, ext: string): string {
  const code = `
    import { mlxVersion, lib } from ${JSON.stringify(join(root, "packages/mlx-ffi/src/index.ts"))};
    const v = mlxVersion(); const abi = lib().mlxb_abi_version();
    const maps = process.platform === "linux" ? require("node:fs").readFileSync("/proc/self/maps", "utf8") : "";
    const libmlx = [...new Set(maps.split("\\n").filter((l) => /libmlx\\.${ext}/.test(l)).map((l) => l.split(/\\s+/).at(-1)))];
    console.log(JSON.stringify({ v, abi, libmlx }));`;
  const env: Record<string, string> = { PATH: process.env.PATH ?? "", HOME: process.env.HOME ?? "", MLX_BUN_NATIVE: join(pkgDir, `libmlxb.${ext}`) };
  const p = Bun.spawnSync([process.execPath, "-e", code], { env, stdout: "pipe", stderr: "pipe" });
  if (p.exitCode !== 0) throw new Error(`the packaged library does not load:\n${p.stderr}`);
  const r = JSON.parse(p.stdout.toString().trim().split("\n").at(-1)!) as { v: string; abi: number; libmlx: string[] };
  if (r.libmlx.length && !r.libmlx.every((l) => l.startsWith(pkgDir))) throw new Error(`libmlx mapped from outside the package: ${r.libmlx}`);
  return `loads: MLX ${r.v}, ABI ${r.abi}${r.libmlx.length ? `, libmlx from ${relative(pkgDir, r.libmlx[0]!)}` : ""}`;
}

function dirSize(d: string): number {
  let n = 0;
  for (const e of readdirSync(d, { recursive: true, withFileTypes: true })) if (e.isFile()) n += statSync(join(e.parentPath, e.name)).size;
  return n;
}

export interface BuildResult {
  target: string;
  dir: string;
  bytes: number;
  check: string;
}

/** Fill <out> (a copy of packages/native-<target>) with the prebuilt files. */
export function buildNativePackage(targetName: string, out: string): BuildResult {
  const t = TARGETS[targetName];
  if (!t) throw new Error(`unknown target ${targetName} (${Object.keys(TARGETS).join(", ")})`);
  if (process.platform !== t.host.platform || process.arch !== t.host.arch) {
    throw new Error(`${targetName} builds on ${t.host.platform}-${t.host.arch}, not on ${process.platform}-${process.arch} (docs/release.md)`);
  }
  const version = pins.mlx!;
  const tree = t.source === "venv" ? venvTree(t.wheel, version) : downloadedTree(t.wheel, version);
  // libmlxb: for a downloaded wheel (CUDA) the CPU wheel's build (see the header comment).
  const buildTree = t.source === "venv" ? tree : venvTree("mlx-cpu", version);
  const libmlxb = buildPrebuilt(join(buildTree.site, "mlx/share/cmake/MLX"), t.ext);

  for (const f of readdirSync(out)) if (f !== "package.json" && f !== "README.md") rmSync(join(out, f), { recursive: true, force: true });
  const copied: string[] = [];
  const copy = (from: string, to: string) => {
    mkdirSync(dirname(join(out, to)), { recursive: true });
    copyFileSync(from, join(out, to));
    copied.push(to);
  };
  copy(libmlxb, `libmlxb.${t.ext}`);
  const wanted = (f: string) => f.startsWith("mlx/lib/") || (t.libs !== undefined && f.startsWith(`${t.libs}/`));
  for (const f of tree.files.filter(wanted)) copy(join(tree.site, f), f);
  for (const f of readdirSync(join(tree.distInfo), { recursive: true, withFileTypes: true })) {
    const rel = relative(tree.distInfo, join(f.parentPath, f.name));
    if (f.isFile() && (rel.startsWith("licenses/") || rel.startsWith("sboms/")))
      copy(join(f.parentPath, f.name), join("licenses", basename(rel) === "LICENSE" ? "MLX-LICENSE" : basename(rel)));
  }
  const libmlx = join(out, "mlx/lib", `libmlx.${t.ext}`);
  if (!existsSync(libmlx)) throw new Error(`the ${t.wheel} wheel has no mlx/lib/libmlx.${t.ext}`);

  let check: string;
  if (targetName.endsWith("-cuda13")) {
    check = checkAbiAgainst(libmlxb, libmlx, join(tree.site, "mlx/include"), join(buildTree.site, "mlx/include"));
  } else {
    check = loadCheck(out, t.ext);
  }
  const floor = t.ext === "so" ? symbolFloor([join(out, "libmlxb.so"), libmlx]) : undefined;
  const abi = /#define\s+MLXB_ABI_VERSION\s+(\d+)/.exec(readFileSync(join(nativeSrc, "include/mlxb.h"), "utf8"))?.[1];
  const info = {
    package: `@mlx-bun/native-${targetName}`,
    mlx: version,
    abi: abi ? Number(abi) : undefined,
    wheel: { name: t.wheel, version, file: tree.wheelFile, sha256: tree.wheelSha256 },
    builtOn: `${process.platform}-${process.arch}`,
    compiler: sh(["c++", "--version"]).split("\n")[0],
    requires: floor ? { glibc: floor.glibc, libstdcxx: `GLIBCXX_${floor.glibcxx}` } : undefined,
    files: Object.fromEntries(copied.sort().map((f) => [f, { bytes: statSync(join(out, f)).size, sha256: sha256(join(out, f)) }])),
  };
  writeFileSync(join(out, "build-info.json"), `${JSON.stringify(info, null, 2)}\n`);
  const bytes = dirSize(out);
  say(`${info.package}: ${copied.length} files, ${(bytes / 1e6).toFixed(1)} MB; ${check}`);
  return { target: targetName, dir: out, bytes, check };
}

if (import.meta.main) {
  const args = process.argv.slice(2);
  const arg = (k: string) => {
    const i = args.indexOf(k);
    return i >= 0 ? args[i + 1] : undefined;
  };
  const target = arg("--target") ?? `${process.platform}-${process.arch}`;
  const out = arg("--out") ?? join(root, "packages", `native-${target}`);
  buildNativePackage(target, out);
}
