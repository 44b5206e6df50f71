// JS numbers in ops: weakly typed like Python scalars in MLX, so `x * 0.5` keeps x's dtype.
import { type Dtype, isFloating, MlxArray } from "@mlx-bun/mlx-ffi";

/** An array or a JS scalar. */
export type Scalar = number | boolean;
export type ArrayOrScalar = MlxArray | Scalar;

/**
 * The dtype a scalar takes next to an array of dtype `other`, as MLX Python:
 * a float scalar adopts a floating array's dtype and makes float32 next to an
 * integer or bool array; an int scalar adopts the array's dtype (bool → int32);
 * a boolean adopts the array's dtype.
 */
export function scalarDtype(value: Scalar, other: Dtype | undefined): Dtype {
  if (typeof value === "boolean") return other ?? "bool";
  const isInt = Number.isInteger(value);
  if (other === undefined) return isInt ? "int32" : "float32";
  if (isFloating(other) || other === "complex64") return other;
  if (!isInt) return "float32";
  return other === "bool" ? "int32" : other;
}

/**
 * Make both operands arrays. Returns the arrays and the ones created here
 * (which the caller disposes after the op).
 */
export function operands(a: ArrayOrScalar, b: ArrayOrScalar): [MlxArray, MlxArray, MlxArray[]] {
  const temps: MlxArray[] = [];
  const toArr = (v: ArrayOrScalar, other: ArrayOrScalar): MlxArray => {
    if (v instanceof MlxArray) return v;
    const t = MlxArray.scalar(v, scalarDtype(v, other instanceof MlxArray ? other.dtype : undefined));
    temps.push(t);
    return t;
  };
  return [toArr(a, b), toArr(b, a), temps];
}

/** Run `fn` with scalars turned into arrays, then free the temporaries. */
export function withOperands(a: ArrayOrScalar, b: ArrayOrScalar, fn: (x: MlxArray, y: MlxArray) => MlxArray): MlxArray {
  const [x, y, temps] = operands(a, b);
  try {
    return fn(x, y);
  } finally {
    for (const t of temps) t.dispose();
  }
}
