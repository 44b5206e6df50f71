/**
 * @mlx-bun/mlx-ops: typed MLX ops named like MLX Python (`mx.*`, `mx.fast.*`).
 */
export * from "./elementwise.ts";
export * from "./reduce.ts";
export * from "./shape.ts";
export { type ArrayOrScalar, type Scalar, scalarDtype } from "./scalar.ts";
export type { Axes } from "./axes.ts";
