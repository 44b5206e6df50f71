import { defineConfig } from "tsup";

// Shared by every package: one ESM entry with type declarations; bun built-ins and the
// workspace packages it depends on stay external.
export function packageBuildConfig(workspaceDeps: readonly string[] = []) {
  return defineConfig({
    entry: ["src/index.ts"],
    format: ["esm"],
    dts: true,
    sourcemap: true,
    clean: true,
    target: "es2022",
    external: ["bun:ffi", "bun", ...workspaceDeps],
  });
}
