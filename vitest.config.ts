import { defineConfig } from "vitest/config";

// One run over every package that has tests (each package's own vitest.config.ts).
export default defineConfig({
  test: {
    projects: ["packages/*/vitest.config.ts", "apps/*/vitest.config.ts"],
  },
});
