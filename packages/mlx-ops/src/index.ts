/**
 * @mlx-bun/mlx-ops: typed MLX ops named like MLX Python (`mx.*`, `mx.random.*`, `mx.fast.*`).
 * `import * as mx from "@mlx-bun/mlx-ops"` and translate line by line: `mx.softmax(x, -1,
 * { precise: true })`, `mx.index(x, ":", -1)` for `x[:, -1]`, `mx.random.normal([2, 3], { key })`.
 */
export * from "./creation.ts";
export * from "./elementwise.ts";
export * from "./reduce.ts";
export * from "./shape.ts";
export * from "./linalg.ts";
export * as random from "./random.ts";
export * as distributed from "./distributed.ts";
export { type ArrayOrScalar, type Scalar, scalarDtype } from "./scalar.ts";
export type { Axes } from "./axes.ts";

// part B exports below
export * from "./part-b.ts";
