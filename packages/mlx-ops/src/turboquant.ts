// TurboQuant primitives: the randomized orthonormal Walsh-Hadamard rotation, Lloyd-Max
// codebooks of the standard Gaussian, and bit-packing of 1-8-bit codes into uint8.
// The KV-cache codec (packages/kv-cache) composes them; each native entry point here is one
// fused composition of plain MLX ops, lazy and on every backend.
import { FFIType } from "bun:ffi";
import { type Dtype, MlxArray, MlxError, type Stream } from "@mlx-bun/mlx-ffi";
import { type GaussianCodebook, LLOYD_MAX_GAUSSIAN } from "./generated/lloyd-max.ts";
import { bindOps, result, sh } from "./native.ts";

const { ptr, i32 } = FFIType;
const lib = bindOps({
  mlxb_tq_fwht: { args: [ptr, ptr, i32, ptr], returns: ptr },
  mlxb_tq_codebook_quantize: { args: [ptr, ptr, ptr], returns: ptr },
  mlxb_tq_codebook_dequantize: { args: [ptr, ptr, ptr], returns: ptr },
  mlxb_tq_pack: { args: [ptr, i32, ptr], returns: ptr },
  mlxb_tq_unpack: { args: [ptr, i32, i32, ptr], returns: ptr },
});

export { type GaussianCodebook, LLOYD_MAX_GAUSSIAN };

/** Head dims the TurboQuant codec is built for. */
export const FWHT_SIZES: readonly number[] = [64, 128, 256, 512];

/**
 * The ±1 sign vector of length n for `seed`, as host numbers. Counter-based (sign i depends on
 * (seed, i) only, through the murmur3 finalizer), so it is the same on every platform and MLX
 * version: rotations persisted with a KV cache stay decodable.
 */
export function sign_values(n: number, seed: number): Int8Array {
  if (!Number.isInteger(n) || n < 0) throw new MlxError(`random_signs: n must be a non-negative integer, got ${n}`);
  if (!Number.isInteger(seed)) throw new MlxError(`random_signs: seed must be an integer, got ${seed}`);
  const out = new Int8Array(n);
  const s = seed >>> 0;
  for (let i = 0; i < n; i++) {
    let h = (s ^ Math.imul(i + 1, 0x9e3779b9)) >>> 0;
    h ^= h >>> 16;
    h = Math.imul(h, 0x85ebca6b);
    h ^= h >>> 13;
    h = Math.imul(h, 0xc2b2ae35);
    h ^= h >>> 16;
    out[i] = h & 1 ? -1 : 1;
  }
  return out;
}

/** The seeded ±1 vector as an array of shape [n] (default float32; cast to x's dtype in fwht). */
export function random_signs(n: number, seed: number, dtype: Dtype = "float32"): MlxArray {
  return MlxArray.fromNumbers(sign_values(n, seed), [n], dtype);
}

function fwht_call(op: string, x: MlxArray, signs: MlxArray | undefined, inverse: boolean, s?: Stream): MlxArray {
  return result(op, lib().mlxb_tq_fwht(x.handle, signs?.handle ?? null, inverse ? 1 : 0, sh(s)), [x, signs ?? "signs=None"]);
}

/**
 * Orthonormal randomized Walsh-Hadamard transform along the last axis (a power of two):
 * y = H (s ⊙ x) / √n. Norms are kept; `fwht_inverse` undoes it.
 */
export function fwht(x: MlxArray, signs?: MlxArray, s?: Stream): MlxArray {
  return fwht_call("turboquant.fwht", x, signs, false, s);
}

/** Inverse of `fwht` with the same signs: x = s ⊙ (H y / √n). */
export function fwht_inverse(y: MlxArray, signs?: MlxArray, s?: Stream): MlxArray {
  return fwht_call("turboquant.fwht_inverse", y, signs, true, s);
}

/** A Lloyd-Max codebook on the device: centroids [2^bits] and boundaries [2^bits - 1]. */
export interface DeviceCodebook extends Disposable {
  readonly bits: number;
  readonly centroids: MlxArray;
  readonly boundaries: MlxArray;
  dispose(): void;
}

/**
 * The Lloyd-Max codebook for N(0, σ²) at 1-4 bits (σ = `scale`, default 1): the standard
 * Gaussian's levels times σ. After an orthonormal rotation of a unit vector of dimension d
 * the coordinates are ≈ N(0, 1/d), so σ = 1/√d there.
 */
export function lloyd_max_codebook(bits: number, opts: { scale?: number; dtype?: Dtype } = {}): DeviceCodebook {
  const book = LLOYD_MAX_GAUSSIAN[bits as 1 | 2 | 3 | 4];
  if (!book) throw new MlxError(`lloyd_max_codebook: bits must be 1, 2, 3 or 4, got ${bits}`);
  const scale = opts.scale ?? 1;
  const dtype = opts.dtype ?? "float32";
  const centroids = MlxArray.fromNumbers(
    book.centroids.map((v) => v * scale),
    [book.centroids.length],
    dtype,
  );
  const boundaries = MlxArray.fromNumbers(
    book.boundaries.map((v) => v * scale),
    [book.boundaries.length],
    dtype,
  );
  const dispose = (): void => {
    centroids.dispose();
    boundaries.dispose();
  };
  return { bits, centroids, boundaries, dispose, [Symbol.dispose]: dispose };
}

/**
 * Nearest-centroid codes (uint8) of x: the number of boundaries strictly below each element
 * (for sorted centroids with midpoint boundaries, that is the nearest centroid; ties go down).
 */
export function codebook_quantize(x: MlxArray, boundaries: MlxArray, s?: Stream): MlxArray {
  return result("turboquant.codebook_quantize", lib().mlxb_tq_codebook_quantize(x.handle, boundaries.handle, sh(s)), [x, boundaries]);
}

/** centroids[codes], in the centroids' dtype. */
export function codebook_dequantize(codes: MlxArray, centroids: MlxArray, s?: Stream): MlxArray {
  return result("turboquant.codebook_dequantize", lib().mlxb_tq_codebook_dequantize(codes.handle, centroids.handle, sh(s)), [codes, centroids]);
}

/** Bytes a row of n codes of `bits` bits packs into: ceil(n·bits / 8). */
export function packed_length(n: number, bits: number): number {
  return Math.ceil((n * bits) / 8);
}

function checkBits(op: string, bits: number): void {
  if (!Number.isInteger(bits) || bits < 1 || bits > 8) throw new MlxError(`${op}: bits must be an integer in 1..8, got ${bits}`);
}

/**
 * Pack integer codes along the last axis into uint8, `bits` bits each, as a little-endian bit
 * stream per row: code i takes bits [i·bits, (i+1)·bits), byte j holds bits [8j, 8j+8) least
 * significant first. Codes are masked to their low `bits` bits. Shape [..., n] → [..., ceil(n·bits/8)].
 */
export function pack_bits(codes: MlxArray, bits: number, s?: Stream): MlxArray {
  checkBits("turboquant.pack", bits);
  return result("turboquant.pack", lib().mlxb_tq_pack(codes.handle, bits, sh(s)), [codes, `bits=${bits}`]);
}

/** Inverse of `pack_bits`: [..., ceil(n·bits/8)] uint8 → [..., n] uint8 codes. */
export function unpack_bits(packed: MlxArray, bits: number, n: number, s?: Stream): MlxArray {
  checkBits("turboquant.unpack", bits);
  if (!Number.isInteger(n) || n < 0) throw new MlxError(`turboquant.unpack: n must be a non-negative integer, got ${n}`);
  return result("turboquant.unpack", lib().mlxb_tq_unpack(packed.handle, bits, n, sh(s)), [packed, `bits=${bits}`, `n=${n}`]);
}

/** TurboQuant primitives under one name. */
export const turboquant = {
  FWHT_SIZES,
  LLOYD_MAX_GAUSSIAN,
  sign_values,
  random_signs,
  fwht,
  fwht_inverse,
  lloyd_max_codebook,
  codebook_quantize,
  codebook_dequantize,
  packed_length,
  pack_bits,
  unpack_bits,
} as const;
