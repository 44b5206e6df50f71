// Finds and opens the native library (libmlxb) and declares its core symbols.
import { dlopen, FFIType, suffix, type Pointer } from "bun:ffi";
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

/** The C ABI version this TypeScript expects (MLXB_ABI_VERSION in native/include/mlxb.h). */
export const ABI_VERSION = 2;

const SETUP_HINT = "run the set-up at the repository root: `bash tools/setup.sh` (or `bun run setup`)";

/** Error raised when libmlxb or MLX itself cannot be found or loaded. */
export class NativeLibraryError extends Error {
  override name = "NativeLibraryError";
}

/** This package's root (src/ and dist/ both sit beside native/). */
const PACKAGE_ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");

/**
 * The prebuilt packages for a platform, in the order they are tried: on Linux x64 the CUDA 13
 * package first (installed only on request, never as an optional dependency) unless
 * MLX_BUN_BACKEND=cpu, then the CPU one; macOS arm64 has the Metal package.
 */
export function prebuiltPackages(platform: string = process.platform, arch: string = process.arch, backend = process.env.MLX_BUN_BACKEND): string[] {
  const base = `@mlx-bun/native-${platform}-${arch}`;
  if (platform === "linux" && arch === "x64" && backend !== "cpu") return [`${base}-cuda13`, base];
  return [base];
}

/** The library inside each installed prebuilt package for this platform (not installed: left out). */
export function prebuiltCandidates(): string[] {
  const req = createRequire(import.meta.url);
  const out: string[] = [];
  for (const name of prebuiltPackages()) {
    try {
      out.push(join(dirname(req.resolve(`${name}/package.json`)), `libmlxb.${suffix}`));
    } catch {
      // not installed (an optional dependency for another platform, or the CUDA package not asked for)
    }
  }
  return out;
}

/**
 * Candidate paths, in order: $MLX_BUN_NATIVE, the prebuilt package for this platform
 * (@mlx-bun/native-*), beside the executable, this package's source build (native/build: the
 * repository's set-up, or `mlx-bun-build-native` in an installed package).
 */
export function libraryCandidates(): string[] {
  const file = `libmlxb.${suffix}`;
  const out: string[] = [];
  const env = process.env.MLX_BUN_NATIVE;
  if (env) out.push(env);
  out.push(...prebuiltCandidates());
  out.push(join(dirname(process.execPath), file));
  out.push(join(PACKAGE_ROOT, "native", "build", file));
  return out;
}

/** What to do when no library is found: install the prebuilt package, or build from source. */
function notFoundHint(): string {
  const plat = `${process.platform}-${process.arch}`;
  const pkg = prebuiltPackages(process.platform, process.arch, "cpu")[0];
  const published = ["linux-x64", "linux-arm64", "darwin-arm64"].includes(plat);
  const prebuilt = published
    ? `the prebuilt ${pkg} (an optional dependency of @mlx-bun/mlx-ffi) is not installed: reinstall without --omit=optional / --no-optional, or \`bun add ${pkg}\``
    : `no prebuilt package exists for ${plat}${process.platform === "linux" ? " (glibc Linux x64/arm64 only)" : ""}`;
  const build = `build it from source: \`bun ${join(PACKAGE_ROOT, "dist", "build-native.js")}\` (needs cmake >= 3.24, a C++20 compiler and MLX 0.32 with its headers: \`pip install mlx-cpu\` or \`brew install mlx\`)`;
  return `${prebuilt}; or ${build}; in the mlx-bun repository, ${SETUP_HINT}`;
}

/** The path of the native library that will be (or was) opened. */
export function resolveLibraryPath(): string {
  const candidates = libraryCandidates();
  const env = process.env.MLX_BUN_NATIVE;
  if (env && !existsSync(env)) {
    throw new NativeLibraryError(`MLX_BUN_NATIVE points at ${env}, which does not exist; unset it or ${SETUP_HINT}`);
  }
  const found = candidates.find((p) => existsSync(p));
  if (!found) {
    throw new NativeLibraryError(`mlx-bun native library not found (looked in: ${candidates.join(", ")}); ${notFoundHint()}`);
  }
  return found;
}

const { ptr, cstring, i32, i64, f64, u64, void: none } = FFIType;

/** Core symbols of the ABI; other packages open the same library with their own tables. */
export const coreSymbols = {
  mlxb_last_error: { args: [], returns: cstring },
  mlxb_clear_error: { args: [], returns: none },
  mlxb_mlx_version: { args: [], returns: cstring },
  mlxb_abi_version: { args: [], returns: i32 },

  mlxb_array_from_bytes: { args: [ptr, u64, ptr, i32, i32], returns: ptr },
  mlxb_array_scalar: { args: [f64, i32], returns: ptr },
  mlxb_array_scalar_int: { args: [i64, i32], returns: ptr },
  mlxb_array_retain: { args: [ptr], returns: ptr },
  mlxb_array_free: { args: [ptr], returns: none },
  mlxb_array_ndim: { args: [ptr], returns: i32 },
  mlxb_array_dim: { args: [ptr, i32], returns: i32 },
  mlxb_array_dtype: { args: [ptr], returns: i32 },
  mlxb_array_size: { args: [ptr], returns: FFIType.i64_fast },
  mlxb_array_nbytes: { args: [ptr], returns: FFIType.i64_fast },
  mlxb_array_itemsize: { args: [ptr], returns: i32 },
  mlxb_array_host_view: { args: [ptr], returns: ptr },
  mlxb_array_data_ptr: { args: [ptr], returns: ptr },
  mlxb_array_item_f64: { args: [ptr], returns: f64 },
  mlxb_array_is_available: { args: [ptr], returns: i32 },
  mlxb_array_wait: { args: [ptr], returns: i32 },
  mlxb_live_handles: { args: [], returns: i32 },

  mlxb_eval: { args: [ptr, i32], returns: i32 },
  mlxb_async_eval: { args: [ptr, i32], returns: i32 },
  mlxb_use_shared_streams: { args: [], returns: i32 },
  mlxb_apply_env_defaults: { args: [], returns: i32 },
  mlxb_async_eval_background: { args: [ptr, i32, ptr, i32], returns: i64 },
  mlxb_join_background: { args: [], returns: i32 },
  mlxb_background_values: { args: [i64, ptr, i32], returns: i32 },
  mlxb_export_to_dot: { args: [ptr, ptr, i32], returns: i32 },

  mlxb_device_is_available: { args: [i32], returns: i32 },
  mlxb_default_device_type: { args: [], returns: i32 },
  mlxb_set_default_device: { args: [i32, i32], returns: i32 },
  mlxb_default_stream: { args: [i32], returns: ptr },
  mlxb_new_stream: { args: [i32], returns: ptr },
  mlxb_set_default_stream: { args: [ptr], returns: i32 },
  mlxb_stream_free: { args: [ptr], returns: none },
  mlxb_stream_index: { args: [ptr], returns: i32 },
  mlxb_stream_device_type: { args: [ptr], returns: i32 },
  mlxb_synchronize: { args: [ptr], returns: i32 },

  mlxb_active_memory: { args: [], returns: FFIType.i64_fast },
  mlxb_peak_memory: { args: [], returns: FFIType.i64_fast },
  mlxb_cache_memory: { args: [], returns: FFIType.i64_fast },
  mlxb_memory_limit: { args: [], returns: FFIType.i64_fast },
  mlxb_reset_peak_memory: { args: [], returns: i32 },
  mlxb_set_memory_limit: { args: [i64], returns: FFIType.i64_fast },
  mlxb_set_cache_limit: { args: [i64], returns: FFIType.i64_fast },
  mlxb_clear_cache: { args: [], returns: i32 },

  mlxb_st_load: { args: [ptr, ptr], returns: ptr },
  mlxb_st_count: { args: [ptr], returns: i32 },
  mlxb_st_name: { args: [ptr, i32], returns: cstring },
  mlxb_st_array: { args: [ptr, i32], returns: ptr },
  mlxb_st_meta_count: { args: [ptr], returns: i32 },
  mlxb_st_meta_key: { args: [ptr, i32], returns: cstring },
  mlxb_st_meta_value: { args: [ptr, i32], returns: cstring },
  mlxb_st_free: { args: [ptr], returns: none },
  mlxb_st_writer_new: { args: [], returns: ptr },
  mlxb_st_writer_add: { args: [ptr, ptr, ptr], returns: i32 },
  mlxb_st_writer_meta: { args: [ptr, ptr, ptr], returns: i32 },
  mlxb_st_writer_save: { args: [ptr, ptr], returns: i32 },
  mlxb_st_writer_free: { args: [ptr], returns: none },
} as const;

/** Open the library with a symbol table; wraps loader failures in a NativeLibraryError. */
export function openLibrary<S extends Record<string, { args: readonly FFIType[]; returns: FFIType }>>(symbols: S): ReturnType<typeof dlopen<S>>["symbols"] {
  const path = resolveLibraryPath();
  try {
    return dlopen(path, symbols).symbols;
  } catch (e) {
    const msg = e instanceof Error ? e.message : String(e);
    const cuda = /native-linux-x64-cuda13/.test(path)
      ? "; the CUDA 13 package needs CUDA 13's libraries (cuBLAS, cuDNN 9, NCCL, cuFFT, cuSOLVER, NVRTC) on the loader path (LD_LIBRARY_PATH), or MLX_BUN_BACKEND=cpu for the CPU package"
      : "";
    throw new NativeLibraryError(`could not load ${path}: ${msg}${cuda}; if MLX (libmlx) is missing or moved, ${SETUP_HINT}`);
  }
}

let core: ReturnType<typeof openLibrary<typeof coreSymbols>> | undefined;

/** The core symbols, opened on first use; checks the ABI version once. */
export function lib(): ReturnType<typeof openLibrary<typeof coreSymbols>> {
  if (core) return core;
  const opened = openLibrary(coreSymbols);
  const v = opened.mlxb_abi_version();
  if (v !== ABI_VERSION) {
    throw new NativeLibraryError(`native library ABI ${v} does not match this package (${ABI_VERSION}); ${SETUP_HINT}`);
  }
  // MLX reads its environment settings once, at first use: mlx-bun's defaults go in first.
  if (opened.mlxb_apply_env_defaults() !== 0) throw new NativeLibraryError(`apply_env_defaults: ${String(opened.mlxb_last_error())}`);
  // Every stream this process uses is one that any thread may evaluate (docs/background-eval.md):
  // MLX 0.32 otherwise ties a stream's encoder to its thread, and an array built before the switch
  // could never be evaluated in the background.
  if (opened.mlxb_use_shared_streams() !== 0) throw new NativeLibraryError(`use_shared_streams: ${String(opened.mlxb_last_error())}`);
  core = opened;
  return core;
}

/** The native error message of the last failed call on this thread. */
export function lastError(): string {
  const l = lib();
  const m = String(l.mlxb_last_error());
  l.mlxb_clear_error();
  return m || "unknown native error";
}

/** Error raised for a failed MLX call; the message names the op and what was wrong. */
export class MlxError extends Error {
  override name = "MlxError";
}

/** Throw an MlxError for `op` with the native message, plus extra context (shapes, dtypes, file). */
export function fail(op: string, context?: string): never {
  const native = lastError();
  throw new MlxError(context ? `${op}(${context}): ${native}` : `${op}: ${native}`);
}

/** Check a returned handle: a null handle becomes an MlxError. */
export function checkHandle(h: Pointer | bigint | null, op: string, context?: () => string): Pointer {
  // bun:ffi returns pointers as numbers; its types also allow bigint.
  if (h === null || h === 0 || h === 0n) fail(op, context?.());
  return (typeof h === "bigint" ? Number(h) : h) as Pointer;
}

/** Check an int status: a negative value becomes an MlxError. */
export function checkStatus(status: number | bigint, op: string, context?: () => string): number {
  const n = Number(status);
  if (n < 0) fail(op, context?.());
  return n;
}

/** A NUL-terminated UTF-8 copy of a string, for `const char*` arguments. */
export function cstr(s: string): Buffer {
  return Buffer.from(`${s}\0`, "utf8");
}
