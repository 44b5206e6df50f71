// Elementwise ops (mx.add, mx.exp, mx.where, mx.astype, ...) and the mlx.nn activations
// (gelu, silu, ...), each one native call composed exactly as mlx.nn composes it.
import { FFIType } from "bun:ffi";
import { type Dtype, dtypeCode, MlxArray, MlxError, type Stream } from "@mlx-bun/mlx-ffi";
import { intArg } from "./axes.ts";
import { bindOps, result, sh, sig } from "./native.ts";
import { type ArrayOrScalar, scalarDtype, withOperands } from "./scalar.ts";

const { ptr, i32 } = FFIType;

const BINARY = [
  "add",
  "subtract",
  "multiply",
  "divide",
  "power",
  "remainder",
  "floor_divide",
  "maximum",
  "minimum",
  "logaddexp",
  "arctan2",
  "equal",
  "not_equal",
  "less",
  "less_equal",
  "greater",
  "greater_equal",
  "logical_and",
  "logical_or",
  "bitwise_and",
  "bitwise_or",
  "bitwise_xor",
  "left_shift",
  "right_shift",
] as const;
const UNARY = [
  "negative",
  "square",
  "reciprocal",
  "abs",
  "sign",
  "sqrt",
  "rsqrt",
  "exp",
  "expm1",
  "log",
  "log2",
  "log10",
  "log1p",
  "sin",
  "cos",
  "tan",
  "tanh",
  "sigmoid",
  "erf",
  "erfinv",
  "floor",
  "ceil",
  "logical_not",
  "bitwise_invert",
  "isnan",
  "isinf",
  "isfinite",
  "stop_gradient",
  "gelu",
  "gelu_approx",
  "gelu_fast_approx",
  "silu",
  "softplus",
  "relu",
] as const;
type BinaryName = (typeof BINARY)[number];
type UnaryName = (typeof UNARY)[number];

const table = {
  ...(Object.fromEntries(BINARY.map((n) => [`mlxb_${n}`, sig.binary])) as Record<`mlxb_${BinaryName}`, typeof sig.binary>),
  ...(Object.fromEntries(UNARY.map((n) => [`mlxb_${n}`, sig.unary])) as Record<`mlxb_${UnaryName}`, typeof sig.unary>),
  mlxb_round: { args: [ptr, i32, ptr], returns: ptr },
  mlxb_astype: { args: [ptr, i32, ptr], returns: ptr },
  mlxb_where: { args: [ptr, ptr, ptr, ptr], returns: ptr },
  mlxb_clip: { args: [ptr, ptr, ptr, ptr], returns: ptr },
} as const;
const lib = bindOps(table);

type BinaryOp = (a: ArrayOrScalar, b: ArrayOrScalar, s?: Stream) => MlxArray;
type UnaryOp = (a: MlxArray, s?: Stream) => MlxArray;

function binary(name: BinaryName): BinaryOp {
  const sym = `mlxb_${name}` as const;
  return (a, b, s) => {
    // Hot path: two arrays need no weak-scalar conversion.
    if (a instanceof MlxArray && b instanceof MlxArray) return result(name, lib()[sym](a.handle, b.handle, sh(s)), [a, b]);
    return withOperands(a, b, (x, y) => result(name, lib()[sym](x.handle, y.handle, sh(s)), [x, y]));
  };
}
function unary(name: UnaryName): UnaryOp {
  const sym = `mlxb_${name}` as const;
  return (a, s) => {
    if (!(a instanceof MlxArray)) throw new MlxError(`${name}: expected an MlxArray, got ${typeof a}`);
    return result(name, lib()[sym](a.handle, sh(s)), [a]);
  };
}

// Arithmetic, with broadcasting; JS numbers are weakly typed (`multiply(x, 0.5)` keeps x's dtype).
export const add = binary("add");
export const subtract = binary("subtract");
export const multiply = binary("multiply");
export const divide = binary("divide");
export const power = binary("power");
export const remainder = binary("remainder");
export const floor_divide = binary("floor_divide");
export const maximum = binary("maximum");
export const minimum = binary("minimum");
export const logaddexp = binary("logaddexp");
export const arctan2 = binary("arctan2");

// Comparisons and logic (bool results).
export const equal = binary("equal");
export const not_equal = binary("not_equal");
export const less = binary("less");
export const less_equal = binary("less_equal");
export const greater = binary("greater");
export const greater_equal = binary("greater_equal");
export const logical_and = binary("logical_and");
export const logical_or = binary("logical_or");

// Bitwise (integer and bool arrays).
export const bitwise_and = binary("bitwise_and");
export const bitwise_or = binary("bitwise_or");
export const bitwise_xor = binary("bitwise_xor");
export const left_shift = binary("left_shift");
export const right_shift = binary("right_shift");

export const negative = unary("negative");
export const square = unary("square");
export const reciprocal = unary("reciprocal");
export const abs = unary("abs");
export const sign = unary("sign");
export const sqrt = unary("sqrt");
export const rsqrt = unary("rsqrt");
export const exp = unary("exp");
export const expm1 = unary("expm1");
export const log = unary("log");
export const log2 = unary("log2");
export const log10 = unary("log10");
export const log1p = unary("log1p");
export const sin = unary("sin");
export const cos = unary("cos");
export const tan = unary("tan");
export const tanh = unary("tanh");
export const sigmoid = unary("sigmoid");
export const erf = unary("erf");
export const erfinv = unary("erfinv");
export const floor = unary("floor");
export const ceil = unary("ceil");
export const logical_not = unary("logical_not");
export const bitwise_invert = unary("bitwise_invert");
export const isnan = unary("isnan");
export const isinf = unary("isinf");
export const isfinite = unary("isfinite");
export const stop_gradient = unary("stop_gradient");

/** mlx.nn.gelu: `x * (1 + erf(x / sqrt(2))) / 2`, bit-exact with mlx.nn. */
export const gelu = unary("gelu");
/** mlx.nn.gelu_approx: `0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))`. */
export const gelu_approx = unary("gelu_approx");
/** mlx.nn.gelu_fast_approx: `x * sigmoid(1.702 * x)`. */
export const gelu_fast_approx = unary("gelu_fast_approx");
/** mlx.nn.silu: `x * sigmoid(x)`. */
export const silu = unary("silu");
/** mlx.nn.softplus: `logaddexp(x, 0)`. */
export const softplus = unary("softplus");
/** mlx.nn.relu: `maximum(x, 0)`. */
export const relu = unary("relu");

/** mx.round to `decimals` places (half to even). */
export function round(a: MlxArray, decimals = 0, s?: Stream): MlxArray {
  intArg("round", "decimals", decimals);
  return result("round", lib().mlxb_round(a.handle, decimals, sh(s)), [a, () => `decimals=${decimals}`]);
}

/** mx.astype */
export function astype(a: MlxArray, dtype: Dtype, s?: Stream): MlxArray {
  return result("astype", lib().mlxb_astype(a.handle, dtypeCode(dtype), sh(s)), [a, dtype]);
}

/** A scalar as an array next to `like` (MLX Python's weak scalar rule); arrays pass through. */
function weak(v: ArrayOrScalar, like: Dtype | undefined, temps: MlxArray[]): MlxArray {
  if (v instanceof MlxArray) return v;
  const t = MlxArray.scalar(v, scalarDtype(v, like));
  temps.push(t);
  return t;
}

/** mx.where(condition, x, y): x where condition is true, else y (scalars weakly typed as in MLX). */
export function where(condition: ArrayOrScalar, x: ArrayOrScalar, y: ArrayOrScalar, s?: Stream): MlxArray {
  const temps: MlxArray[] = [];
  try {
    const c = weak(condition, undefined, temps);
    return withOperands(x, y, (a, b) => result("where", lib().mlxb_where(c.handle, a.handle, b.handle, sh(s)), [c, a, b]));
  } finally {
    for (const t of temps) t.dispose();
  }
}

/** mx.clip(a, a_min, a_max); either bound may be null. Scalar bounds take a's dtype as in MLX. */
export function clip(a: MlxArray, a_min: ArrayOrScalar | null, a_max: ArrayOrScalar | null, s?: Stream): MlxArray {
  if (a_min === null && a_max === null) throw new MlxError("clip: at least one of a_min and a_max must be given");
  const temps: MlxArray[] = [];
  try {
    const lo = a_min === null ? null : weak(a_min, a.dtype, temps);
    const hi = a_max === null ? null : weak(a_max, a.dtype, temps);
    return result("clip", lib().mlxb_clip(a.handle, lo?.handle ?? null, hi?.handle ?? null, sh(s)), [a, lo ?? "None", hi ?? "None"]);
  } finally {
    for (const t of temps) t.dispose();
  }
}
