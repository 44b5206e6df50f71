// Lloyd-Max scalar quantizers for the standard Gaussian N(0, 1), computed from the optimality
// conditions (not copied from a table), written to packages/mlx-ops/src/generated/lloyd-max.ts.
//
//   bun tools/lloyd-max.ts            write the generated file
//   bun tools/lloyd-max.ts --check    exit 1 if the file on disk differs from a fresh run
//
// For L = 2^bits levels, a quantizer is optimal (for mean squared error) when
//   - each boundary is the midpoint of its two neighbouring centroids, and
//   - each centroid is the conditional mean of its cell:
//       c_i = (φ(b_{i-1}) - φ(b_i)) / (Φ(b_i) - Φ(b_{i-1}))
// Lloyd's algorithm alternates the two conditions until nothing moves (in float64).
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

const SQRT2 = Math.SQRT2;
const SQRT_PI = Math.sqrt(Math.PI);

/** Standard normal density. */
export function pdf(x: number): number {
  if (!Number.isFinite(x)) return 0;
  return Math.exp(-0.5 * x * x) / Math.sqrt(2 * Math.PI);
}

/**
 * erfc(x) for x >= 0 in float64. Small x: erf by its all-positive series
 * erf(x) = 2/√π e^{-x²} Σ (2x²)^n x / (1·3·…·(2n+1)), no cancellation; large x: the
 * continued fraction of erfc (modified Lentz), which converges fast there.
 */
function erfcPos(x: number): number {
  if (x < 2.5) {
    let term = x;
    let sum = x;
    for (let n = 1; n < 500; n++) {
      term *= (2 * x * x) / (2 * n + 1);
      sum += term;
      if (term < sum * 1e-17) break;
    }
    return 1 - (2 / SQRT_PI) * Math.exp(-x * x) * sum;
  }
  // erfc(x) = e^{-x²}/√π · 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + 2/(x + ...)))))
  const tiny = 1e-300;
  let f = x;
  let c = x;
  let d = 0;
  for (let n = 1; n < 500; n++) {
    const a = n / 2;
    d = x + a * d;
    d = d === 0 ? tiny : d;
    c = x + a / c;
    c = c === 0 ? tiny : c;
    d = 1 / d;
    const delta = c * d;
    f *= delta;
    if (Math.abs(delta - 1) < 1e-17) break;
  }
  return Math.exp(-x * x) / SQRT_PI / f;
}

/** Upper tail Q(x) = 1 - Φ(x), accurate in both tails. */
export function upperTail(x: number): number {
  if (x === Infinity) return 0;
  if (x === -Infinity) return 1;
  return x >= 0 ? 0.5 * erfcPos(x / SQRT2) : 1 - 0.5 * erfcPos(-x / SQRT2);
}

/** P(a < X < b) for X ~ N(0, 1), without cancellation when both are in the same tail. */
export function mass(a: number, b: number): number {
  if (a >= 0) return upperTail(a) - upperTail(b);
  if (b <= 0) return upperTail(-b) - upperTail(-a);
  return 1 - upperTail(-a) - upperTail(b);
}

export interface Quantizer {
  bits: number;
  centroids: number[];
  /** L - 1 interior boundaries (the cells' edges; ±∞ at the ends are implied). */
  boundaries: number[];
  /** Mean squared error E[(X - q(X))²]. */
  mse: number;
  iterations: number;
}

/** Run Lloyd's algorithm for 2^bits levels to a fixed point in float64. */
export function lloydMax(bits: number, maxIter = 100_000): Quantizer {
  const L = 2 ** bits;
  // Symmetric start, evenly spaced on [-2, 2]; Lloyd keeps the symmetry and the order.
  let c = Array.from({ length: L }, (_, i) => (L === 1 ? 0 : -2 + (4 * i) / (L - 1)));
  let b: number[] = [];
  let it = 0;
  // Lloyd converges linearly (slowly at 4 bits): run until the step stops shrinking, i.e. the
  // iterate sits at its float64 fixed point (the last ulp may cycle); keep the best step.
  let best = Infinity;
  let sinceBest = 0;
  for (; it < maxIter && sinceBest < 500; it++) {
    b = c.slice(1).map((v, i) => (c[i]! + v) / 2);
    const edges = [-Infinity, ...b, Infinity];
    const next = c.map((_, i) => (pdf(edges[i]!) - pdf(edges[i + 1]!)) / mass(edges[i]!, edges[i + 1]!));
    // Keep the exact symmetry the problem has (rounding would otherwise drift it by an ulp).
    for (let i = 0; i < L / 2; i++) {
      const m = (next[L - 1 - i]! - next[i]!) / 2;
      next[i] = -m;
      next[L - 1 - i] = m;
    }
    const moved = Math.max(...next.map((v, i) => Math.abs(v - c[i]!)));
    c = next;
    if (moved === 0) break;
    if (moved < best) {
      best = moved;
      sinceBest = 0;
    } else sinceBest++;
  }
  if (it === maxIter) throw new Error(`lloyd-max: ${bits} bits did not converge in ${maxIter} iterations`);
  b = c.slice(1).map((v, i) => (c[i]! + v) / 2);
  return { bits, centroids: c, boundaries: b, mse: distortion(c, b), iterations: it + 1 };
}

/**
 * E[(X - q(X))²] = Σ_i ∫_cell (x - c_i)² φ = Σ_i [ m2_i - 2 c_i m1_i + c_i² p_i ] with the
 * cell's mass p, first moment m1 = φ(a) - φ(b), second moment m2 = p + aφ(a) - bφ(b).
 */
export function distortion(c: readonly number[], b: readonly number[]): number {
  const edges = [-Infinity, ...b, Infinity];
  let e = 0;
  for (let i = 0; i < c.length; i++) {
    const lo = edges[i]!;
    const hi = edges[i + 1]!;
    const p = mass(lo, hi);
    const m1 = pdf(lo) - pdf(hi);
    const xphi = (x: number): number => (Number.isFinite(x) ? x * pdf(x) : 0);
    const m2 = p + xphi(lo) - xphi(hi);
    e += m2 - 2 * c[i]! * m1 + c[i]! * c[i]! * p;
  }
  return e;
}

export const GENERATED_PATH = join(import.meta.dir, "..", "packages", "mlx-ops", "src", "generated", "lloyd-max.ts");

/** The generated module's text. Numbers print as the shortest round-tripping float64. */
export function render(qs: readonly Quantizer[]): string {
  const rows = qs
    .map(
      (q) =>
        `  ${q.bits}: {\n` +
        `    centroids: [${q.centroids.join(", ")}],\n` +
        `    boundaries: [${q.boundaries.join(", ")}],\n` +
        `    mse: ${q.mse},\n` +
        `  },`,
    )
    .join("\n");
  return `// GENERATED by \`bun tools/lloyd-max.ts\` (Lloyd's algorithm on N(0, 1) in float64). Do not edit.
// Lloyd-Max codebooks of the standard Gaussian for 1-4 bits: sorted centroids, the L - 1
// cell boundaries between them (midpoints), and the quantizer's mean squared error.

export interface GaussianCodebook {
  readonly centroids: readonly number[];
  readonly boundaries: readonly number[];
  readonly mse: number;
}

export const LLOYD_MAX_GAUSSIAN: Readonly<Record<1 | 2 | 3 | 4, GaussianCodebook>> = {
${rows}
};
`;
}

if (import.meta.main) {
  const text = render([1, 2, 3, 4].map((bits) => lloydMax(bits)));
  if (process.argv.includes("--check")) {
    const onDisk = readFileSync(GENERATED_PATH, "utf8");
    if (onDisk !== text) {
      console.error(`${GENERATED_PATH} is stale: run bun tools/lloyd-max.ts`);
      process.exit(1);
    }
    console.log("lloyd-max: up to date");
  } else {
    writeFileSync(GENERATED_PATH, text);
    console.log(`wrote ${GENERATED_PATH}`);
  }
}
