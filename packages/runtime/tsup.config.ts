import { defineConfig } from "tsup";

export default defineConfig({
  entry: ["src/index.ts"],
  format: ["esm"],
  dts: true,
  sourcemap: true,
  clean: true,
  target: "es2022",
  external: ["bun:ffi", "bun", "@mlx-bun/mlx-ffi", "@mlx-bun/mlx-ops", "@mlx-bun/kv-cache", "@mlx-bun/models"],
});
