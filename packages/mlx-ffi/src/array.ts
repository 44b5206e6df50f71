// MlxArray: owns exactly one native array handle.
import { toArrayBuffer, type Pointer } from "bun:ffi";
import { type Dtype, type HostArray, dtypeCode, dtypeFromCode, dtypeOfHostArray, hostArrayFromBytes, isDtype, itemSize } from "./dtype.ts";
import { fromBfloat16Bits, fromFloat16Bits, toBfloat16Bits, toFloat16Bits } from "./half.ts";
import { checkHandle, checkStatus, lib, MlxError } from "./library.ts";

/** A nested list of numbers (or booleans/bigints) as `tolist()` returns. */
export type NestedList = number | bigint | boolean | NestedList[];

// Safety net only: an array that was never disposed is freed when collected.
const registry = new FinalizationRegistry<Pointer>((h) => lib().mlxb_array_free(h));

const INSPECT = Symbol.for("nodejs.util.inspect.custom");

function formatShape(shape: readonly number[]): string {
  return `[${shape.join(", ")}]`;
}

/** Validate a shape: non-negative integers, within int32. */
export function checkShape(shape: readonly number[], op: string): Int32Array {
  for (const d of shape) {
    if (!Number.isInteger(d) || d < 0 || d > 0x7fffffff) {
      throw new MlxError(`${op}: invalid shape ${formatShape(shape)}: dimensions must be non-negative integers`);
    }
  }
  return Int32Array.from(shape);
}

function product(shape: readonly number[]): number {
  let n = 1;
  for (const d of shape) n *= d;
  return n;
}

/** An MLX array. Dispose it (`using`, or `dispose()`) when done; each instance owns one native handle. */
export class MlxArray implements Disposable {
  #handle: Pointer | null;
  #shape: readonly number[] | undefined;
  #dtype: Dtype | undefined;

  private constructor(handle: Pointer) {
    this.#handle = handle;
    registry.register(this, handle, this);
  }

  /** Take ownership of a native handle (as returned by an `mlxb_*` call). Throws on a null handle. */
  static fromHandle(handle: Pointer | bigint | null, op = "MlxArray.fromHandle"): MlxArray {
    return new MlxArray(checkHandle(handle, op));
  }

  /** Copy a TypedArray into a new array of the given shape (default: 1-D) and dtype (default: the TypedArray's). */
  static fromTypedArray(data: HostArray, shape?: readonly number[], dtype?: Dtype): MlxArray {
    const dt = dtype ?? dtypeOfHostArray(data);
    const sh = shape ?? [dt === "complex64" ? data.length / 2 : data.length];
    const dims = checkShape(sh, "fromTypedArray");
    const code = dtypeCode(dt);
    if (data.byteLength !== product(sh) * itemSize(dt)) {
      throw new MlxError(
        `fromTypedArray: ${data.constructor.name} of ${data.byteLength} bytes does not fit shape ${formatShape(sh)} of ${dt} (${product(sh) * itemSize(dt)} bytes)`,
      );
    }
    const bytes = data.byteLength === 0 ? null : data;
    return MlxArray.fromHandle(lib().mlxb_array_from_bytes(bytes, data.byteLength, dims, dims.length, code), `fromTypedArray(${formatShape(sh)}, ${dt})`);
  }

  /** Convert JS numbers (row-major) into an array of `dtype` (default float32), rounding as MLX would. */
  static fromNumbers(values: ArrayLike<number | bigint | boolean>, shape: readonly number[], dtype: Dtype = "float32"): MlxArray {
    if (!isDtype(dtype)) dtypeCode(dtype);
    checkShape(shape, "fromNumbers");
    const n = product(shape);
    if (values.length !== (dtype === "complex64" ? 2 * n : n)) {
      throw new MlxError(`fromNumbers: ${values.length} values do not fit shape ${formatShape(shape)} of ${dtype}`);
    }
    return MlxArray.fromTypedArray(encodeNumbers(values, dtype), shape, dtype);
  }

  /** A 0-d array holding one value. */
  static scalar(value: number | bigint | boolean, dtype: Dtype = "float32"): MlxArray {
    const code = dtypeCode(dtype);
    const l = lib();
    if (typeof value === "bigint" || ((dtype === "int64" || dtype === "uint64") && Number.isInteger(value))) {
      return MlxArray.fromNumbers([value], [], dtype);
    }
    return MlxArray.fromHandle(l.mlxb_array_scalar(Number(value), code), `scalar(${String(value)}, ${dtype})`);
  }

  /** The native handle; throws if the array was disposed. */
  get handle(): Pointer {
    if (this.#handle === null) throw new MlxError("MlxArray used after dispose()");
    return this.#handle;
  }

  /** True once `dispose()` has run. */
  get disposed(): boolean {
    return this.#handle === null;
  }

  get shape(): readonly number[] {
    if (this.#shape) return this.#shape;
    const l = lib();
    const h = this.handle;
    const n = checkStatus(l.mlxb_array_ndim(h), "shape");
    const s: number[] = new Array(n);
    for (let i = 0; i < n; i++) s[i] = l.mlxb_array_dim(h, i);
    // Not frozen: Object.freeze costs ~0.5 µs an array in JavaScriptCore, more than reading the
    // dims; the readonly type keeps callers from writing to the cached list.
    this.#shape = s;
    return this.#shape;
  }

  get ndim(): number {
    return this.shape.length;
  }

  get dtype(): Dtype {
    this.#dtype ??= dtypeFromCode(checkStatus(lib().mlxb_array_dtype(this.handle), "dtype"));
    return this.#dtype;
  }

  get size(): number {
    return product(this.shape);
  }

  get itemsize(): number {
    return itemSize(this.dtype);
  }

  get nbytes(): number {
    return this.size * this.itemsize;
  }

  /** Evaluate this array now. */
  eval(): this {
    const h = new BigUint64Array([BigInt(this.handle)]);
    checkStatus(lib().mlxb_eval(h, 1), "eval", () => this.describe());
    return this;
  }

  /** A new handle to the same array (shares data; dispose both). */
  retain(): MlxArray {
    return MlxArray.fromHandle(lib().mlxb_array_retain(this.handle), "retain");
  }

  /** Evaluate and copy the raw elements out, in row-major order (see HostArray for the mapping). */
  toTypedArray(): HostArray {
    const dt = this.dtype;
    const n = this.size;
    const nbytes = this.nbytes;
    if (nbytes === 0) return hostArrayFromBytes(dt, new ArrayBuffer(0), 0);
    const l = lib();
    const view = checkHandle(l.mlxb_array_host_view(this.handle), "toTypedArray", () => this.describe());
    try {
      const p = checkHandle(l.mlxb_array_data_ptr(view), "toTypedArray", () => this.describe());
      // Copy in JS from native memory; never let native code write into a JS TypedArray.
      const copy = toArrayBuffer(p, 0, nbytes).slice(0);
      return hostArrayFromBytes(dt, copy, n);
    } finally {
      l.mlxb_array_free(view);
    }
  }

  /** Elements as JS numbers (bool as 0/1, 64-bit ints as numbers, half types decoded). complex64 gives [re, im, ...]. */
  toFloat64Array(): Float64Array {
    const raw = this.toTypedArray();
    const dt = this.dtype;
    if (dt === "bfloat16") return Float64Array.from(raw as Uint16Array, fromBfloat16Bits);
    if (dt === "float16") return Float64Array.from(raw as Uint16Array, fromFloat16Bits);
    if (raw instanceof BigInt64Array || raw instanceof BigUint64Array) return Float64Array.from(raw, (v) => Number(v));
    return Float64Array.from(raw as ArrayLike<number>);
  }

  /** Nested JS lists like MLX Python's `tolist()` (bool → boolean, int64 → bigint beyond 2^53 kept as bigint). */
  tolist(): NestedList {
    const dt = this.dtype;
    let flat: NestedList[];
    if (dt === "bool") flat = Array.from(this.toTypedArray() as Uint8Array, (v) => v !== 0);
    else if (dt === "int64" || dt === "uint64") {
      flat = Array.from(this.toTypedArray() as BigInt64Array, (v) =>
        v <= BigInt(Number.MAX_SAFE_INTEGER) && v >= BigInt(Number.MIN_SAFE_INTEGER) ? Number(v) : v,
      );
    } else if (dt === "complex64") {
      const f = this.toTypedArray() as Float32Array;
      flat = [];
      for (let i = 0; i < f.length; i += 2) flat.push([f[i]!, f[i + 1]!]);
    } else flat = Array.from(this.toFloat64Array());
    const shape = this.shape;
    if (shape.length === 0) return flat[0]!;
    const build = (axis: number, offset: number): [NestedList[], number] => {
      const out: NestedList[] = [];
      const n = shape[axis]!;
      for (let i = 0; i < n; i++) {
        if (axis === shape.length - 1) out.push(flat[offset++]!);
        else {
          const [sub, next] = build(axis + 1, offset);
          out.push(sub);
          offset = next;
        }
      }
      return [out, offset];
    };
    return build(0, 0)[0];
  }

  /** The single element as a number (evaluates). */
  item(): number {
    if (this.size !== 1) throw new MlxError(`item(): needs an array of size 1, got shape ${formatShape(this.shape)}`);
    const l = lib();
    const v = l.mlxb_array_item_f64(this.handle);
    // NaN is also the failure value: only a set error message means failure.
    if (Number.isNaN(v) && String(l.mlxb_last_error()) !== "") checkStatus(-1, "item", () => this.describe());
    return v;
  }

  /** Free the native handle now. Safe to call twice. */
  dispose(): void {
    const h = this.#handle;
    if (h === null) return;
    this.#handle = null;
    registry.unregister(this);
    lib().mlxb_array_free(h);
  }

  [Symbol.dispose](): void {
    this.dispose();
  }

  /** "array(shape=[2, 3], dtype=float32)": never the data, which may be huge. */
  describe(): string {
    if (this.#handle === null) return "array(<disposed>)";
    return `array(shape=${formatShape(this.shape)}, dtype=${this.dtype})`;
  }

  toString(): string {
    return this.describe();
  }

  [INSPECT](): string {
    return this.describe();
  }
}

function encodeNumbers(values: ArrayLike<number | bigint | boolean>, dtype: Dtype): HostArray {
  const n = values.length;
  const num = (i: number): number => Number(values[i]);
  switch (dtype) {
    case "bool":
      return Uint8Array.from({ length: n }, (_, i) => (values[i] ? 1 : 0));
    case "bfloat16":
      return Uint16Array.from({ length: n }, (_, i) => toBfloat16Bits(num(i)));
    case "float16":
      return Uint16Array.from({ length: n }, (_, i) => toFloat16Bits(num(i)));
    case "int64":
      return BigInt64Array.from({ length: n }, (_, i) => BigInt.asIntN(64, BigInt(values[i] as number | bigint)));
    case "uint64":
      return BigUint64Array.from({ length: n }, (_, i) => BigInt.asUintN(64, BigInt(values[i] as number | bigint)));
    case "float32":
    case "complex64":
      return Float32Array.from({ length: n }, (_, i) => num(i));
    case "float64":
      return Float64Array.from({ length: n }, (_, i) => num(i));
    case "int8":
      return Int8Array.from({ length: n }, (_, i) => num(i));
    case "uint8":
      return Uint8Array.from({ length: n }, (_, i) => num(i));
    case "int16":
      return Int16Array.from({ length: n }, (_, i) => num(i));
    case "uint16":
      return Uint16Array.from({ length: n }, (_, i) => num(i));
    case "int32":
      return Int32Array.from({ length: n }, (_, i) => num(i));
    case "uint32":
      return Uint32Array.from({ length: n }, (_, i) => num(i));
  }
}

/** The address of a handle list, for calls that take (uint64*, count). */
export function handleList(arrays: readonly MlxArray[]): BigUint64Array {
  const out = new BigUint64Array(arrays.length);
  for (let i = 0; i < arrays.length; i++) out[i] = BigInt(arrays[i]!.handle);
  return out;
}
