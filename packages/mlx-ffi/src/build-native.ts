#!/usr/bin/env bun
// mlx-bun-build-native: the source build, for a machine with no prebuilt @mlx-bun/native-* package
// (another platform or libc, or optional dependencies omitted). Builds this package's native/
// sources with CMake against an installed MLX into native/build/, where the loader looks last.
//   bun node_modules/@mlx-bun/mlx-ffi/dist/build-native.js     (MLX_DIR=<prefix>/share/cmake/MLX to pick an MLX)
// With no CMake, no C++ compiler or no MLX it builds nothing and says what is missing and how to
// get it. In the mlx-bun repository tools/setup.sh does this build (same CMake project).
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const PACKAGE_ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const NATIVE = join(PACKAGE_ROOT, "native");
const BUILD = join(NATIVE, "build");
const MIN_CMAKE = [3, 24];

function run(cmd: string[]): { ok: boolean; out: string } {
  try {
    const p = Bun.spawnSync(cmd, { stdout: "pipe", stderr: "pipe" });
    return { ok: p.exitCode === 0, out: `${p.stdout.toString()}${p.stderr.toString()}`.trim() };
  } catch {
    return { ok: false, out: "" };
  }
}

/** CMake on PATH, at least 3.24: its path, or why not. */
export function findCmake(): { path?: string; problem?: string } {
  const path = Bun.which("cmake");
  if (!path) return { problem: "cmake >= 3.24: not found on PATH (apt install cmake, brew install cmake, or pip install cmake)" };
  const m = /cmake version (\d+)\.(\d+)/.exec(run([path, "--version"]).out);
  const v = m ? [Number(m[1]), Number(m[2])] : [0, 0];
  if (v[0]! < MIN_CMAKE[0]! || (v[0] === MIN_CMAKE[0] && v[1]! < MIN_CMAKE[1]!)) {
    return { problem: `cmake >= 3.24: ${path} is ${v.join(".")} (pip install cmake gives a newer one)` };
  }
  return { path };
}

/** A C++20 compiler: $CXX, c++, g++ or clang++. */
export function findCompiler(): { path?: string; problem?: string } {
  for (const c of [process.env.CXX, "c++", "g++", "clang++"]) {
    if (!c) continue;
    const path = Bun.which(c);
    if (path) return { path };
  }
  return {
    problem: `a C++20 compiler: none found ($CXX, c++, g++, clang++) (apt install g++, dnf install gcc-c++, or xcode-select --install)`,
  };
}

/** MLX's CMake package directory: $MLX_DIR, the python3 on PATH's mlx wheel, or Homebrew's mlx. */
export function findMlx(): { dir?: string; problem?: string } {
  const env = process.env.MLX_DIR;
  if (env) {
    return existsSync(join(env, "MLXConfig.cmake")) ? { dir: env } : { problem: `MLX: MLX_DIR=${env} holds no MLXConfig.cmake` };
  }
  for (const py of ["python3", "python"]) {
    if (!Bun.which(py)) continue;
    const r = run([py, "-m", "mlx", "--cmake-dir"]);
    const dir = join(r.out.split("\n").at(-1) ?? "", "share", "cmake", "MLX");
    if (r.ok && existsSync(join(dir, "MLXConfig.cmake"))) return { dir };
  }
  if (process.platform === "darwin" && Bun.which("brew")) {
    const r = run(["brew", "--prefix", "mlx"]);
    const dir = join(r.out, "share", "cmake", "MLX");
    if (r.ok && existsSync(join(dir, "MLXConfig.cmake"))) return { dir };
  }
  const how =
    process.platform === "darwin"
      ? "brew install mlx, or pip install mlx mlx-metal"
      : "pip install mlx mlx-cpu (or mlx-cuda-13 on NVIDIA) into the python3 on PATH";
  return { problem: `MLX 0.32 with its headers and CMake files: not found (${how}; or set MLX_DIR=<prefix>/share/cmake/MLX)` };
}

/** Build native/build/libmlxb; returns the process exit code. */
export function buildNative(log: (s: string) => void = (s) => process.stderr.write(`${s}\n`)): number {
  const cmake = findCmake();
  const cxx = findCompiler();
  const mlx = findMlx();
  const problems = [cmake.problem, cxx.problem, mlx.problem].filter((p): p is string => !!p);
  if (problems.length > 0) {
    log(
      [
        `mlx-bun-build-native: cannot build the mlx-bun native library from source on this machine (${process.platform}-${process.arch}). Missing:`,
        ...problems.map((p) => `  - ${p}`),
        "Prebuilt packages exist for linux-x64 and linux-arm64 (glibc >= 2.35) and darwin-arm64: " +
          "@mlx-bun/mlx-ffi installs the one for this machine as an optional dependency.",
      ].join("\n"),
    );
    return 1;
  }
  log(`mlx-bun-build-native: building ${BUILD} with ${cmake.path} and ${cxx.path} against ${mlx.dir}`);
  const env = { ...process.env, CXX: cxx.path! };
  const steps = [
    [cmake.path!, "-S", NATIVE, "-B", BUILD, "-DCMAKE_BUILD_TYPE=Release", `-DMLX_DIR=${mlx.dir}`],
    [cmake.path!, "--build", BUILD, "--parallel", String(navigator.hardwareConcurrency || 2)],
  ];
  for (const cmd of steps) {
    const p = Bun.spawnSync(cmd, { stdout: "inherit", stderr: "inherit", env });
    if (p.exitCode !== 0) {
      log(`mlx-bun-build-native: \`${cmd.join(" ")}\` failed (exit ${p.exitCode})`);
      return p.exitCode || 1;
    }
  }
  log(`mlx-bun-build-native: built ${join(BUILD, `libmlxb.${process.platform === "darwin" ? "dylib" : "so"}`)}`);
  return 0;
}

if (import.meta.main) process.exit(buildNative());
