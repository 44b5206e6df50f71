// MLX dtypes: names, native codes, sizes, the TypedArray each one reads into.

/** MLX dtype names, as in MLX Python (`mx.float32` is "float32"). */
export type Dtype =
  | "bool"
  | "uint8"
  | "uint16"
  | "uint32"
  | "uint64"
  | "int8"
  | "int16"
  | "int32"
  | "int64"
  | "float16"
  | "float32"
  | "float64"
  | "bfloat16"
  | "complex64";

/** Every dtype in native code order (mlx::core::Dtype::Val). */
export const DTYPES: readonly Dtype[] = [
  "bool",
  "uint8",
  "uint16",
  "uint32",
  "uint64",
  "int8",
  "int16",
  "int32",
  "int64",
  "float16",
  "float32",
  "float64",
  "bfloat16",
  "complex64",
];

const CODES = new Map<Dtype, number>(DTYPES.map((d, i) => [d, i]));
const SIZES: Record<Dtype, number> = {
  bool: 1,
  uint8: 1,
  uint16: 2,
  uint32: 4,
  uint64: 8,
  int8: 1,
  int16: 2,
  int32: 4,
  int64: 8,
  float16: 2,
  float32: 4,
  float64: 8,
  bfloat16: 2,
  complex64: 8,
};

/** True when `name` is an MLX dtype name. */
export function isDtype(name: unknown): name is Dtype {
  return typeof name === "string" && CODES.has(name as Dtype);
}

/** Native code of a dtype; throws for an unknown name. */
export function dtypeCode(d: Dtype): number {
  const c = CODES.get(d);
  if (c === undefined) throw new TypeError(`unsupported dtype ${JSON.stringify(d)} (one of ${DTYPES.join(", ")})`);
  return c;
}

/** Dtype of a native code. */
export function dtypeFromCode(code: number): Dtype {
  const d = DTYPES[code];
  if (d === undefined) throw new TypeError(`unknown native dtype code ${code}`);
  return d;
}

/** Bytes per element. */
export function itemSize(d: Dtype): number {
  dtypeCode(d);
  return SIZES[d];
}

export function isFloating(d: Dtype): boolean {
  return d === "float16" || d === "float32" || d === "float64" || d === "bfloat16";
}
export function isInteger(d: Dtype): boolean {
  return d.startsWith("int") || d.startsWith("uint");
}

/**
 * The TypedArray that holds a dtype's raw elements: bool → Uint8Array (0/1),
 * float16/bfloat16 → Uint16Array (bit patterns), complex64 → Float32Array
 * (interleaved re, im), 64-bit ints → BigInt64Array/BigUint64Array.
 */
export type HostArray =
  | Uint8Array
  | Int8Array
  | Uint16Array
  | Int16Array
  | Uint32Array
  | Int32Array
  | BigUint64Array
  | BigInt64Array
  | Float32Array
  | Float64Array;

export function hostArrayFromBytes(d: Dtype, bytes: ArrayBuffer, count: number): HostArray {
  switch (d) {
    case "bool":
    case "uint8":
      return new Uint8Array(bytes, 0, count);
    case "int8":
      return new Int8Array(bytes, 0, count);
    case "uint16":
    case "float16":
    case "bfloat16":
      return new Uint16Array(bytes, 0, count);
    case "int16":
      return new Int16Array(bytes, 0, count);
    case "uint32":
      return new Uint32Array(bytes, 0, count);
    case "int32":
      return new Int32Array(bytes, 0, count);
    case "uint64":
      return new BigUint64Array(bytes, 0, count);
    case "int64":
      return new BigInt64Array(bytes, 0, count);
    case "float32":
      return new Float32Array(bytes, 0, count);
    case "float64":
      return new Float64Array(bytes, 0, count);
    case "complex64":
      return new Float32Array(bytes, 0, count * 2);
  }
}

/** The dtype a TypedArray maps to when none is given. */
export function dtypeOfHostArray(a: HostArray): Dtype {
  if (a instanceof Float32Array) return "float32";
  if (a instanceof Float64Array) return "float64";
  if (a instanceof Int32Array) return "int32";
  if (a instanceof Uint32Array) return "uint32";
  if (a instanceof Int16Array) return "int16";
  if (a instanceof Uint16Array) return "uint16";
  if (a instanceof Int8Array) return "int8";
  if (a instanceof Uint8Array) return "uint8";
  if (a instanceof BigInt64Array) return "int64";
  return "uint64";
}
