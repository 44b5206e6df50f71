// safetensors load (lazy, header checked first) and atomic save.
import { closeSync, constants, fstatSync, openSync, readSync, renameSync, rmSync } from "node:fs";
import { dirname, basename, join } from "node:path";
import { MlxArray } from "./array.ts";
import { itemSize, type Dtype } from "./dtype.ts";
import { checkHandle, checkStatus, cstr, fail, lib, MlxError } from "./library.ts";
import type { Stream } from "./runtime.ts";

/** safetensors dtype names → MLX dtypes. */
const ST_DTYPES: Record<string, Dtype> = {
  BOOL: "bool",
  U8: "uint8",
  U16: "uint16",
  U32: "uint32",
  U64: "uint64",
  I8: "int8",
  I16: "int16",
  I32: "int32",
  I64: "int64",
  F16: "float16",
  BF16: "bfloat16",
  F32: "float32",
  F64: "float64",
  C64: "complex64",
};

/** Error for a file that is missing, truncated or not valid safetensors; names the file and field. */
export class SafetensorsError extends MlxError {
  override name = "SafetensorsError";
}

/** One tensor's header entry. */
export interface TensorInfo {
  dtype: Dtype;
  shape: number[];
  /** Byte range inside the data section. */
  dataOffsets: [number, number];
}

/** A parsed, checked header: every tensor fits inside the file and matches its shape and dtype. */
export interface SafetensorsHeader {
  tensors: Map<string, TensorInfo>;
  metadata: Record<string, string>;
  /** Byte offset where the data section starts (8 + header length). */
  dataStart: number;
}

const MAX_HEADER = 100 * 1024 * 1024;

/** What a non-regular file is, for messages. */
function fileKind(st: import("node:fs").Stats): string {
  if (st.isDirectory()) return "a directory";
  if (st.isFIFO()) return "a FIFO";
  if (st.isSocket()) return "a socket";
  if (st.isCharacterDevice() || st.isBlockDevice()) return "a device";
  return "not a regular file";
}

/**
 * Read and validate a safetensors header without reading tensor data. Only a regular file is
 * read: a FIFO, device or directory is refused at once (opened non-blocking, never read).
 */
export function readSafetensorsHeader(path: string): SafetensorsHeader {
  let fd: number;
  try {
    // O_NONBLOCK: opening a FIFO with no writer would otherwise wait forever (no effect on a regular file).
    fd = openSync(path, constants.O_RDONLY | constants.O_NONBLOCK);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    throw new SafetensorsError(`safetensors ${path}: ${code === "ENOENT" ? "file not found" : code === "EISDIR" ? "a directory, not a file" : String(e)}`);
  }
  try {
    const st = fstatSync(fd);
    const bad = (what: string): never => {
      throw new SafetensorsError(`safetensors ${path}: ${what}`);
    };
    if (!st.isFile()) bad(`${fileKind(st)}, not a regular file`);
    const size = st.size;
    if (size < 8) bad(`file is ${size} bytes, too short for a header`);
    const lenBuf = Buffer.alloc(8);
    readSync(fd, lenBuf, 0, 8, 0);
    const headerLen = Number(lenBuf.readBigUInt64LE(0));
    if (headerLen > MAX_HEADER || 8 + headerLen > size) {
      bad(`header length ${headerLen} exceeds the file (${size} bytes): truncated or not safetensors`);
    }
    const hbuf = Buffer.alloc(headerLen);
    readSync(fd, hbuf, 0, headerLen, 8);
    let json: unknown;
    try {
      json = JSON.parse(hbuf.toString("utf8"));
    } catch (e) {
      bad(`header is not valid JSON (${(e as Error).message})`);
    }
    if (typeof json !== "object" || json === null || Array.isArray(json)) bad("header is not a JSON object");
    const dataStart = 8 + headerLen;
    const dataSize = size - dataStart;
    const tensors = new Map<string, TensorInfo>();
    let metadata: Record<string, string> = {};
    for (const [name, raw] of Object.entries(json as Record<string, unknown>)) {
      if (name === "__metadata__") {
        if (raw === null) continue; // MLX writes null for empty metadata
        if (typeof raw !== "object" || Array.isArray(raw)) bad("__metadata__ is not an object");
        for (const [k, v] of Object.entries(raw as Record<string, unknown>)) {
          if (typeof v !== "string") bad(`__metadata__.${k} is not a string`);
        }
        metadata = raw as Record<string, string>;
        continue;
      }
      const e = raw as { dtype?: unknown; shape?: unknown; data_offsets?: unknown };
      const where = `tensor '${name}'`;
      if (typeof e !== "object" || e === null) bad(`${where} is not an object`);
      const dtype = typeof e.dtype === "string" ? ST_DTYPES[e.dtype] : undefined;
      if (!dtype) bad(`${where}: unsupported dtype ${JSON.stringify(e.dtype)}`);
      const shape = e.shape;
      if (!Array.isArray(shape) || !shape.every((d) => Number.isInteger(d) && d >= 0)) {
        bad(`${where}: shape ${JSON.stringify(shape)} is not a list of non-negative integers`);
      }
      const offs = e.data_offsets;
      if (!Array.isArray(offs) || offs.length !== 2 || !offs.every((o) => Number.isInteger(o) && o >= 0)) {
        bad(`${where}: data_offsets ${JSON.stringify(offs)} is not [begin, end]`);
      }
      const [begin, end] = offs as [number, number];
      const want = (shape as number[]).reduce((a, b) => a * b, 1) * itemSize(dtype!);
      if (end < begin || end - begin !== want) {
        bad(`${where}: data_offsets [${begin}, ${end}] hold ${end - begin} bytes but ${dtype} ${JSON.stringify(shape)} needs ${want}`);
      }
      if (end > dataSize) bad(`${where}: data_offsets end ${end} is past the data section (${dataSize} bytes): file truncated?`);
      tensors.set(name, { dtype: dtype!, shape: shape as number[], dataOffsets: [begin, end] });
    }
    return { tensors, metadata, dataStart };
  } finally {
    closeSync(fd);
  }
}

/** What `loadSafetensors` returns: lazily loaded arrays (owned by the caller) and the metadata map. */
export interface SafetensorsLoad extends Disposable {
  tensors: Map<string, MlxArray>;
  metadata: Record<string, string>;
}

/** Load a safetensors file lazily (data is read on eval), as `mx.load(path, return_metadata=True)`. */
export function loadSafetensors(path: string, stream?: Stream): SafetensorsLoad {
  readSafetensorsHeader(path);
  const l = lib();
  const h = checkHandle(l.mlxb_st_load(cstr(path), stream?.handle ?? null), "load_safetensors", () => path);
  try {
    const tensors = new Map<string, MlxArray>();
    const n = checkStatus(l.mlxb_st_count(h), "load_safetensors");
    for (let i = 0; i < n; i++) {
      tensors.set(String(l.mlxb_st_name(h, i)), MlxArray.fromHandle(l.mlxb_st_array(h, i), "load_safetensors"));
    }
    const metadata: Record<string, string> = {};
    const m = checkStatus(l.mlxb_st_meta_count(h), "load_safetensors");
    for (let i = 0; i < m; i++) metadata[String(l.mlxb_st_meta_key(h, i))] = String(l.mlxb_st_meta_value(h, i));
    return {
      tensors,
      metadata,
      [Symbol.dispose]() {
        for (const a of tensors.values()) a.dispose();
      },
    };
  } finally {
    l.mlxb_st_free(h);
  }
}

/**
 * Save arrays (and string metadata) as safetensors. The file is written to a
 * temporary name in the same directory and renamed into place, so a reader
 * never sees a half-written file and a failed save leaves the old one intact.
 */
export function saveSafetensors(path: string, tensors: Map<string, MlxArray> | Record<string, MlxArray>, metadata: Record<string, string> = {}): void {
  const l = lib();
  const w = checkHandle(l.mlxb_st_writer_new(), "save_safetensors");
  const entries = tensors instanceof Map ? [...tensors] : Object.entries(tensors);
  const tmp = join(dirname(path), `.${basename(path)}.${process.pid}.${Date.now()}.tmp`);
  try {
    for (const [name, a] of entries) {
      checkStatus(l.mlxb_st_writer_add(w, cstr(name), a.handle), "save_safetensors", () => `${path}: tensor '${name}'`);
    }
    for (const [k, v] of Object.entries(metadata)) {
      if (typeof v !== "string") throw new SafetensorsError(`save_safetensors ${path}: metadata '${k}' is not a string`);
      checkStatus(l.mlxb_st_writer_meta(w, cstr(k), cstr(v)), "save_safetensors");
    }
    // MLX appends ".safetensors" to a name without that extension.
    const tmpFile = `${tmp}.safetensors`;
    if (l.mlxb_st_writer_save(w, cstr(tmpFile)) < 0) {
      rmSync(tmpFile, { force: true });
      fail("save_safetensors", path);
    }
    renameSync(tmpFile, path);
  } finally {
    l.mlxb_st_writer_free(w);
  }
}
