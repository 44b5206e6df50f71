// mx.random with explicit keys: the same key gives the same bits as MLX Python (same MLX
// build, same mlx::core::random calls with the same argument types). Without a key, MLX's
// global key sequence is used (seeded by `seed`).
import { FFIType } from "bun:ffi";
import { type Dtype, dtypeCode, MlxArray, MlxError, type Stream } from "@mlx-bun/mlx-ffi";
import { fmt, intArg, shapeArg } from "./axes.ts";
import { bindOps, result, sh } from "./native.ts";
import { type ArrayOrScalar, scalarDtype } from "./scalar.ts";

const { ptr, i32, f64, u64 } = FFIType;
const lib = bindOps({
  mlxb_random_key: { args: [u64], returns: ptr },
  mlxb_random_seed: { args: [u64], returns: i32 },
  mlxb_random_split: { args: [ptr, i32, ptr], returns: ptr },
  mlxb_random_uniform: { args: [ptr, ptr, ptr, i32, i32, ptr, ptr], returns: ptr },
  mlxb_random_normal: { args: [ptr, i32, i32, f64, f64, ptr, ptr], returns: ptr },
  mlxb_random_randint: { args: [ptr, ptr, ptr, i32, i32, ptr, ptr], returns: ptr },
  mlxb_random_bernoulli: { args: [ptr, ptr, i32, ptr, ptr], returns: ptr },
  mlxb_random_truncated_normal: { args: [ptr, ptr, ptr, i32, i32, ptr, ptr], returns: ptr },
  mlxb_random_gumbel: { args: [ptr, i32, i32, ptr, ptr], returns: ptr },
  mlxb_random_laplace: { args: [ptr, i32, i32, f64, f64, ptr, ptr], returns: ptr },
  mlxb_random_categorical: { args: [ptr, i32, i32, ptr, i32, i32, ptr, ptr], returns: ptr },
  mlxb_random_permutation: { args: [ptr, i32, ptr, ptr], returns: ptr },
  mlxb_random_permutation_n: { args: [i32, ptr, ptr], returns: ptr },
});

/** Options shared by the samplers. */
export interface RandomOptions {
  /** A PRNG key from `key()`/`split()`; omitted: MLX's global key sequence. */
  key?: MlxArray;
  stream?: Stream;
}
export interface DtypeRandomOptions extends RandomOptions {
  dtype?: Dtype;
}

function checkSeed(seed: number | bigint): number | bigint {
  if (typeof seed === "number" && (!Number.isSafeInteger(seed) || seed < 0)) {
    throw new MlxError(`random: seed must be a non-negative integer, got ${seed}`);
  }
  if (typeof seed === "bigint" && (seed < 0n || seed >= 1n << 64n)) throw new MlxError(`random: seed ${seed} is not a uint64`);
  return seed;
}

/** mx.random.key: a PRNG key (uint32 [2]) from a seed. */
export function key(seed: number | bigint): MlxArray {
  return result("random.key", lib().mlxb_random_key(checkSeed(seed)), [String(seed)]);
}

/** mx.random.seed: seed the global key sequence. */
export function seed(s: number | bigint): void {
  const st = lib().mlxb_random_seed(checkSeed(s));
  if (st < 0) result("random.seed", null, [String(s)]);
}

/** mx.random.split: `num` sub-keys stacked along axis 0 (shape [num, 2]); index them with `take(keys, i, 0)`. */
export function split(k: MlxArray, num = 2, s?: Stream): MlxArray {
  intArg("random.split", "num", num);
  return result("random.split", lib().mlxb_random_split(k.handle, num, sh(s)), [k, num]);
}

/** A scalar bound as MLX Python converts it (no dtype hint: int32, float32 or bool). */
function bound(v: ArrayOrScalar, temps: MlxArray[]): MlxArray {
  if (v instanceof MlxArray) return v;
  const t = MlxArray.scalar(v, scalarDtype(v, undefined));
  temps.push(t);
  return t;
}
function withBounds(lo: ArrayOrScalar, hi: ArrayOrScalar, fn: (l: MlxArray, h: MlxArray) => MlxArray): MlxArray {
  const temps: MlxArray[] = [];
  try {
    return fn(bound(lo, temps), bound(hi, temps));
  } finally {
    for (const t of temps) t.dispose();
  }
}

/** mx.random.uniform over [low, high) (default float32). Python's `uniform(shape=s)` is `uniform(0, 1, s)`. */
export function uniform(low: ArrayOrScalar = 0, high: ArrayOrScalar = 1, shape: readonly number[] = [], opts: DtypeRandomOptions = {}): MlxArray {
  const [p, n] = shapeArg("random.uniform", shape);
  const dtype = opts.dtype ?? "float32";
  return withBounds(low, high, (l, h) =>
    result("random.uniform", lib().mlxb_random_uniform(l.handle, h.handle, p, n, dtypeCode(dtype), opts.key?.handle ?? null, sh(opts.stream)), [
      l,
      h,
      shape,
      dtype,
    ]),
  );
}

export interface NormalOptions extends DtypeRandomOptions {
  loc?: number;
  scale?: number;
}
/** mx.random.normal (default float32, loc 0, scale 1). */
export function normal(shape: readonly number[] = [], opts: NormalOptions = {}): MlxArray {
  const [p, n] = shapeArg("random.normal", shape);
  const dtype = opts.dtype ?? "float32";
  return result("random.normal", lib().mlxb_random_normal(p, n, dtypeCode(dtype), opts.loc ?? 0, opts.scale ?? 1, opts.key?.handle ?? null, sh(opts.stream)), [
    shape,
    dtype,
  ]);
}

/** mx.random.randint over [low, high) (default int32). */
export function randint(low: ArrayOrScalar, high: ArrayOrScalar, shape: readonly number[] = [], opts: DtypeRandomOptions = {}): MlxArray {
  const [p, n] = shapeArg("random.randint", shape);
  const dtype = opts.dtype ?? "int32";
  return withBounds(low, high, (l, h) =>
    result("random.randint", lib().mlxb_random_randint(l.handle, h.handle, p, n, dtypeCode(dtype), opts.key?.handle ?? null, sh(opts.stream)), [
      l,
      h,
      shape,
      dtype,
    ]),
  );
}

/** mx.random.bernoulli: true with probability p (shape defaults to p's shape). */
export function bernoulli(p: ArrayOrScalar = 0.5, shape?: readonly number[], opts: RandomOptions = {}): MlxArray {
  const [sp, n] = shape === undefined ? [null, -1] : shapeArg("random.bernoulli", shape);
  const temps: MlxArray[] = [];
  try {
    const pa = bound(p, temps);
    return result("random.bernoulli", lib().mlxb_random_bernoulli(pa.handle, sp, n, opts.key?.handle ?? null, sh(opts.stream)), [pa, shape ?? "None"]);
  } finally {
    for (const t of temps) t.dispose();
  }
}

/** mx.random.truncated_normal on (lower, upper) (shape defaults to the bounds' broadcast shape). */
export function truncated_normal(lower: ArrayOrScalar, upper: ArrayOrScalar, shape?: readonly number[], opts: DtypeRandomOptions = {}): MlxArray {
  const [sp, n] = shape === undefined ? [null, -1] : shapeArg("random.truncated_normal", shape);
  const dtype = opts.dtype ?? "float32";
  return withBounds(lower, upper, (l, u) =>
    result(
      "random.truncated_normal",
      lib().mlxb_random_truncated_normal(l.handle, u.handle, sp, n, dtypeCode(dtype), opts.key?.handle ?? null, sh(opts.stream)),
      [l, u, shape ?? "None", dtype],
    ),
  );
}

/** mx.random.gumbel: standard Gumbel samples (default float32). */
export function gumbel(shape: readonly number[] = [], opts: DtypeRandomOptions = {}): MlxArray {
  const [p, n] = shapeArg("random.gumbel", shape);
  const dtype = opts.dtype ?? "float32";
  return result("random.gumbel", lib().mlxb_random_gumbel(p, n, dtypeCode(dtype), opts.key?.handle ?? null, sh(opts.stream)), [shape, dtype]);
}

/** mx.random.laplace (default float32, loc 0, scale 1). */
export function laplace(shape: readonly number[] = [], opts: NormalOptions = {}): MlxArray {
  const [p, n] = shapeArg("random.laplace", shape);
  const dtype = opts.dtype ?? "float32";
  return result(
    "random.laplace",
    lib().mlxb_random_laplace(p, n, dtypeCode(dtype), opts.loc ?? 0, opts.scale ?? 1, opts.key?.handle ?? null, sh(opts.stream)),
    [shape, dtype],
  );
}

export interface CategoricalOptions extends RandomOptions {
  /** The axis holding the distribution (default -1). */
  axis?: number;
  /** Output shape; at most one of shape and num_samples. */
  shape?: readonly number[];
  /** Samples per distribution, in a new last axis. */
  num_samples?: number;
}
/** mx.random.categorical: sample indices (uint32) from unnormalized log-probabilities. */
export function categorical(logits: MlxArray, opts: CategoricalOptions = {}): MlxArray {
  const axis = intArg("random.categorical", "axis", opts.axis ?? -1);
  if (opts.shape !== undefined && opts.num_samples !== undefined) {
    throw new MlxError("random.categorical: at most one of shape and num_samples can be given");
  }
  const [p, n] = opts.shape === undefined ? [null, 0] : shapeArg("random.categorical", opts.shape);
  const mode = opts.shape !== undefined ? 1 : opts.num_samples !== undefined ? 2 : 0;
  const ns = opts.num_samples === undefined ? 0 : intArg("random.categorical", "num_samples", opts.num_samples);
  return result("random.categorical", lib().mlxb_random_categorical(logits.handle, axis, mode, p, n, ns, opts.key?.handle ?? null, sh(opts.stream)), [
    logits,
    `axis=${axis}`,
  ]);
}

/** mx.random.permutation: a shuffled copy of x along `axis`, or a permutation of arange(x) for a number. */
export function permutation(x: MlxArray | number, axis = 0, opts: RandomOptions = {}): MlxArray {
  intArg("random.permutation", "axis", axis);
  if (typeof x === "number") {
    intArg("random.permutation", "x", x);
    return result("random.permutation", lib().mlxb_random_permutation_n(x, opts.key?.handle ?? null, sh(opts.stream)), [x]);
  }
  return result("random.permutation", lib().mlxb_random_permutation(x.handle, axis, opts.key?.handle ?? null, sh(opts.stream)), [x, `axis=${axis}`]);
}
