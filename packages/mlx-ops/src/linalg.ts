// Matrix products (mx.matmul, mx.addmm, mx.outer, ...).
import { FFIType } from "bun:ffi";
import { MlxError, type MlxArray, type Stream } from "@mlx-bun/mlx-ffi";
import { intsArg } from "./axes.ts";
import { bindOps, result, sh, sig } from "./native.ts";

const { ptr, i32, f64 } = FFIType;
const lib = bindOps({
  mlxb_matmul: sig.binary,
  mlxb_outer: sig.binary,
  mlxb_inner: sig.binary,
  mlxb_addmm: { args: [ptr, ptr, ptr, f64, f64, ptr], returns: ptr },
  mlxb_tensordot: { args: [ptr, ptr, ptr, ptr, i32, ptr], returns: ptr },
  mlxb_block_masked_mm: { args: [ptr, ptr, i32, ptr, ptr, ptr, ptr], returns: ptr },
});

/** mx.matmul (a @ b) with batch broadcasting. */
export function matmul(a: MlxArray, b: MlxArray, s?: Stream): MlxArray {
  return result("matmul", lib().mlxb_matmul(a.handle, b.handle, sh(s)), [a, b]);
}

/** mx.outer product of two vectors (flattened). */
export function outer(a: MlxArray, b: MlxArray, s?: Stream): MlxArray {
  return result("outer", lib().mlxb_outer(a.handle, b.handle, sh(s)), [a, b]);
}

/** mx.inner product over the last axes. */
export function inner(a: MlxArray, b: MlxArray, s?: Stream): MlxArray {
  return result("inner", lib().mlxb_inner(a.handle, b.handle, sh(s)), [a, b]);
}

export interface AddmmOptions {
  alpha?: number;
  beta?: number;
  stream?: Stream;
}
/** mx.addmm: beta * c + alpha * (a @ b) in one op (alpha, beta float32; default 1). */
export function addmm(c: MlxArray, a: MlxArray, b: MlxArray, opts: AddmmOptions = {}): MlxArray {
  const alpha = opts.alpha ?? 1;
  const beta = opts.beta ?? 1;
  return result("addmm", lib().mlxb_addmm(c.handle, a.handle, b.handle, alpha, beta, sh(opts.stream)), [c, a, b, `alpha=${alpha}`, `beta=${beta}`]);
}

/** mx.tensordot contracting axes_a of a with axes_b of b. */
export function tensordot(a: MlxArray, b: MlxArray, axes: readonly [readonly number[], readonly number[]], s?: Stream): MlxArray {
  const [pa, na] = intsArg("tensordot", "axes", axes[0]);
  const [pb, nb] = intsArg("tensordot", "axes", axes[1]);
  if (na !== nb) throw new MlxError(`tensordot: axes lists ${JSON.stringify(axes)} differ in length`);
  return result("tensordot", lib().mlxb_tensordot(a.handle, b.handle, pa, pb, na, sh(s)), [a, b, JSON.stringify(axes)]);
}

export interface BlockMaskOptions {
  mask_out?: MlxArray;
  mask_lhs?: MlxArray;
  mask_rhs?: MlxArray;
  stream?: Stream;
}
/** mx.block_masked_mm: matmul with block_size x block_size blocks masked out. */
export function block_masked_mm(a: MlxArray, b: MlxArray, block_size = 64, opts: BlockMaskOptions = {}): MlxArray {
  return result(
    "block_masked_mm",
    lib().mlxb_block_masked_mm(
      a.handle,
      b.handle,
      block_size,
      opts.mask_out?.handle ?? null,
      opts.mask_lhs?.handle ?? null,
      opts.mask_rhs?.handle ?? null,
      sh(opts.stream),
    ),
    [a, b, `block_size=${block_size}`],
  );
}
