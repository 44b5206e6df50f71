// Read-only file mappings: arrays over byte ranges of a file without reading it into MLX
// buffers, and a safetensors writer whose layout lets every tensor be mapped in place.
import { FFIType, toArrayBuffer, type Pointer } from "bun:ffi";
import { closeSync, fsyncSync, openSync, renameSync, rmSync, writeSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import { checkShape, MlxArray } from "./array.ts";
import { dtypeCode, type Dtype } from "./dtype.ts";
import { checkHandle, checkStatus, cstr, lib, MlxError, openLibrary } from "./library.ts";
import { evaluate } from "./runtime.ts";
import { readSafetensorsHeader, type SafetensorsHeader, SafetensorsError } from "./safetensors.ts";

const { ptr, i32, u64, void: none } = FFIType;

const symbols = {
  mlxb_mmap_open: { args: [ptr], returns: ptr },
  mlxb_mmap_size: { args: [ptr], returns: FFIType.i64_fast },
  mlxb_mmap_array: { args: [ptr, u64, ptr, i32, i32], returns: ptr },
  mlxb_mmap_close: { args: [ptr], returns: none },
  mlxb_mmap_is_mapped: { args: [ptr, ptr], returns: i32 },
  mlxb_mmap_live: { args: [], returns: i32 },
} as const;

let opened: ReturnType<typeof openLibrary<typeof symbols>> | undefined;
function mm(): ReturnType<typeof openLibrary<typeof symbols>> {
  lib(); // checks the ABI version once
  return (opened ??= openLibrary(symbols));
}

/**
 * A file mapped read-only (mmap, MAP_PRIVATE). Arrays made with `array()` read its bytes in
 * place where the backend allows (see `isMapped`), and each keeps the mapping alive: `close()`
 * drops only this handle's reference, munmap runs once the last array over it is gone too.
 * The file must not be truncated or rewritten in place while arrays over it live (replacing it
 * by rename, as the writers here do, is safe: the mapping keeps the old contents).
 */
export class MappedFile implements Disposable {
  #h: Pointer | null;
  readonly size: number;

  private constructor(
    h: Pointer,
    readonly path: string,
  ) {
    this.#h = h;
    this.size = checkStatus(mm().mlxb_mmap_size(h), "mmap_size");
  }

  static open(path: string): MappedFile {
    return new MappedFile(
      checkHandle(mm().mlxb_mmap_open(cstr(path)), "mmap_open", () => path),
      path,
    );
  }

  #handle(): Pointer {
    if (this.#h === null) throw new MlxError(`MappedFile ${this.path}: used after close()`);
    return this.#h;
  }

  /** An array of `shape`/`dtype` over the bytes at `offset` (row-major); owned by the caller. */
  array(offset: number, shape: readonly number[], dtype: Dtype): MlxArray {
    const dims = checkShape(shape, "MappedFile.array");
    return MlxArray.fromHandle(mm().mlxb_mmap_array(this.#handle(), offset, dims, dims.length, dtypeCode(dtype)), "MappedFile.array");
  }

  /** True when `a`'s data lies inside this mapping (read in place, not copied). */
  isMapped(a: MlxArray): boolean {
    return checkStatus(mm().mlxb_mmap_is_mapped(a.handle, this.#handle()), "mmap_is_mapped") === 1;
  }

  close(): void {
    if (this.#h !== null) mm().mlxb_mmap_close(this.#h);
    this.#h = null;
  }

  [Symbol.dispose](): void {
    this.close();
  }
}

/** File mappings still alive (open handles, or arrays over them): a leak detector for tests. */
export function liveMappings(): number {
  return mm().mlxb_mmap_live();
}

/** Name prefix of the padding tensors `saveMappableSafetensors` writes (skipped by `mapSafetensors`). */
export const PAD_PREFIX = "__pad.";

export interface MappableSaveOptions {
  /** Alignment of every tensor's absolute file offset (default 64). */
  align?: number;
  /** Alignment of tensors of at least `pageFrom` bytes (default 16384, Apple's page size; a multiple of 4096). */
  pageAlign?: number;
  /** Default 1 MiB. */
  pageFrom?: number;
  /**
   * Name prefix of the padding tensors (default `PAD_PREFIX`); e.g. one under a key a reader's
   * tree of tensor names ignores. Tensors may not use it.
   */
  padPrefix?: string;
}

/** What `saveMappableSafetensors` wrote. */
export interface MappableSaveInfo {
  /** File size in bytes. */
  bytes: number;
  /** Bytes of tensor data (padding excluded). */
  dataBytes: number;
}

const ST_NAMES: Partial<Record<Dtype, string>> = {
  bool: "BOOL",
  uint8: "U8",
  uint16: "U16",
  uint32: "U32",
  uint64: "U64",
  int8: "I8",
  int16: "I16",
  int32: "I32",
  int64: "I64",
  float16: "F16",
  bfloat16: "BF16",
  float32: "F32",
  float64: "F64",
  complex64: "C64",
};

const roundUp = (n: number, a: number): number => Math.ceil(n / a) * a;

/**
 * Save tensors (in the given order) and string metadata as a valid safetensors file laid out for
 * mapping: the header is padded with spaces so the data section starts aligned, and before each
 * tensor sits a padding tensor (`__pad.<i>`, uint8, at least 8 bytes) whose last 8 bytes hold the
 * tensor's byte size as little-endian u64 (the header MLX's CPU allocator keeps before a buffer,
 * so `MappedFile.array` can hand the bytes to MLX in place), so each tensor starts at an aligned
 * absolute offset and the data section has no holes. Written to a temporary file in the same
 * folder, fsynced and renamed into place: readers never see a partial file, and a failed save
 * leaves an existing file untouched.
 */
export function saveMappableSafetensors(
  path: string,
  tensors: Iterable<[string, MlxArray]>,
  metadata: Record<string, string> = {},
  opts: MappableSaveOptions = {},
): MappableSaveInfo {
  const align = opts.align ?? 64;
  const pageAlign = opts.pageAlign ?? 16384;
  const pageFrom = opts.pageFrom ?? 1 << 20;
  const padPrefix = opts.padPrefix ?? PAD_PREFIX;
  if (align % 8 !== 0 || pageAlign % align !== 0) throw new MlxError(`saveMappableSafetensors ${path}: align must be a multiple of 8 dividing pageAlign`);
  const entries = [...tensors];
  const bad = (what: string): never => {
    throw new SafetensorsError(`saveMappableSafetensors ${path}: ${what}`);
  };
  for (const [k, v] of Object.entries(metadata)) if (typeof v !== "string") bad(`metadata '${k}' is not a string`);
  const seen = new Set<string>();
  for (const [name, a] of entries) {
    if (name === "__metadata__" || name.startsWith(padPrefix)) bad(`tensor name '${name}' is reserved`);
    if (seen.has(name)) bad(`duplicate tensor name '${name}'`);
    seen.add(name);
    if (!ST_NAMES[a.dtype]) bad(`tensor '${name}': dtype ${a.dtype} has no safetensors name`);
  }
  // Layout relative to the data section, which itself starts at a multiple of the largest alignment.
  const big = entries.some(([, a]) => a.nbytes >= pageFrom);
  const headAlign = big ? pageAlign : align;
  const header: Record<string, unknown> = {};
  const plan: { pad: number; at: number; a: MlxArray }[] = [];
  let rel = 0;
  entries.forEach(([name, a], i) => {
    const al = a.nbytes >= pageFrom ? pageAlign : align;
    const at = roundUp(rel + 8, al);
    const pad = at - rel;
    header[`${padPrefix}${i}`] = { dtype: "U8", shape: [pad], data_offsets: [rel, at] };
    header[name] = { dtype: ST_NAMES[a.dtype], shape: [...a.shape], data_offsets: [at, at + a.nbytes] };
    plan.push({ pad, at, a });
    rel = at + a.nbytes;
  });
  header.__metadata__ = metadata;
  let json = Buffer.from(JSON.stringify(header), "utf8");
  const padded = roundUp(8 + json.length, headAlign) - 8;
  json = Buffer.concat([json, Buffer.alloc(padded - json.length, 0x20)]);

  const tmp = join(dirname(path), `.${basename(path)}.${process.pid}.${Date.now()}.${Math.random().toString(36).slice(2, 8)}.tmp`);
  const l = lib();
  let fd: number | null = null;
  try {
    evaluate(...entries.map(([, a]) => a));
    fd = openSync(tmp, "w", 0o644);
    const writeAll = (buf: Uint8Array): void => {
      let off = 0;
      while (off < buf.length) off += writeSync(fd!, buf, off, buf.length - off);
    };
    const len = Buffer.alloc(8);
    len.writeBigUInt64LE(BigInt(json.length));
    writeAll(len);
    writeAll(json);
    for (const { pad, a } of plan) {
      const p = Buffer.alloc(pad);
      p.writeBigUInt64LE(BigInt(a.nbytes), pad - 8);
      writeAll(p);
      if (a.nbytes === 0) continue;
      const view = checkHandle(l.mlxb_array_host_view(a.handle), "saveMappableSafetensors", () => a.describe());
      try {
        const data = checkHandle(l.mlxb_array_data_ptr(view), "saveMappableSafetensors", () => a.describe());
        writeAll(new Uint8Array(toArrayBuffer(data, 0, a.nbytes)));
      } finally {
        l.mlxb_array_free(view);
      }
    }
    fsyncSync(fd);
    closeSync(fd);
    fd = null;
    renameSync(tmp, path);
  } catch (e) {
    if (fd !== null) closeSync(fd);
    rmSync(tmp, { force: true });
    throw e;
  }
  try {
    const dfd = openSync(dirname(path), "r");
    try {
      fsyncSync(dfd);
    } finally {
      closeSync(dfd);
    }
  } catch {
    // best effort: some file systems refuse fsync on a directory
  }
  return { bytes: 8 + json.length + rel, dataBytes: plan.reduce((s, p) => s + p.a.nbytes, 0) };
}

/** What `mapSafetensors` returns: arrays over the mapped file (owned by the caller) and the metadata. */
export interface MappedSafetensors extends Disposable {
  tensors: Map<string, MlxArray>;
  metadata: Record<string, string>;
  header: SafetensorsHeader;
  /** Names of the tensors read in place (the others were copied by the backend). */
  mapped: Set<string>;
}

/**
 * Map a safetensors file read-only and make an array over each tensor (padding tensors skipped:
 * `PAD_PREFIX`, and `opts.padPrefix` when the file was written with another).
 * The header is validated first (`readSafetensorsHeader`: offsets against the file size); the
 * arrays read the file in place where the backend allows, else they are copied at once.
 */
export function mapSafetensors(path: string, opts: { padPrefix?: string } = {}): MappedSafetensors {
  const header = readSafetensorsHeader(path);
  const tensors = new Map<string, MlxArray>();
  const mapped = new Set<string>();
  const m = MappedFile.open(path);
  try {
    const need = header.dataStart + Math.max(0, ...[...header.tensors.values()].map((t) => t.dataOffsets[1]));
    if (m.size < need) throw new SafetensorsError(`safetensors ${path}: file changed while opening (${m.size} bytes, header needs ${need})`);
    for (const [name, info] of header.tensors) {
      if (name.startsWith(PAD_PREFIX) || (opts.padPrefix && name.startsWith(opts.padPrefix))) continue;
      const a = m.array(header.dataStart + info.dataOffsets[0], info.shape, info.dtype);
      tensors.set(name, a);
      if (m.isMapped(a)) mapped.add(name);
    }
  } catch (e) {
    for (const a of tensors.values()) a.dispose();
    throw e;
  } finally {
    m.close();
  }
  return {
    tensors,
    metadata: header.metadata,
    header,
    mapped,
    [Symbol.dispose]() {
      for (const a of tensors.values()) a.dispose();
    },
  };
}
