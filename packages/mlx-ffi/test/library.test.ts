import { describe, expect, test } from "vitest";
import { libraryCandidates, prebuiltPackages, resolveLibraryPath } from "../src/index.ts";

function runWith(env: Record<string, string>): { code: number; err: string } {
  const p = Bun.spawnSync(
    [process.execPath, "-e", `import { mlxVersion } from "${new URL("../src/index.ts", import.meta.url).pathname}"; console.log(mlxVersion());`],
    {
      env: { ...process.env, ...env },
      stderr: "pipe",
      stdout: "pipe",
    },
  );
  return { code: p.exitCode ?? -1, err: p.stderr.toString() };
}

describe("library resolution", () => {
  test("order: MLX_BUN_NATIVE, the prebuilt package, beside the executable, the set-up build", () => {
    const c = libraryCandidates();
    expect(c.at(-1)).toMatch(/native\/build\/libmlxb\.(so|dylib)$/);
    expect(resolveLibraryPath()).toMatch(/libmlxb/);
  });

  test("prebuilt packages per platform: CUDA first on Linux x64 unless MLX_BUN_BACKEND=cpu", () => {
    expect(prebuiltPackages("linux", "x64", undefined)).toEqual(["@mlx-bun/native-linux-x64-cuda13", "@mlx-bun/native-linux-x64"]);
    expect(prebuiltPackages("linux", "x64", "cpu")).toEqual(["@mlx-bun/native-linux-x64"]);
    expect(prebuiltPackages("linux", "arm64", undefined)).toEqual(["@mlx-bun/native-linux-arm64"]);
    expect(prebuiltPackages("darwin", "arm64", undefined)).toEqual(["@mlx-bun/native-darwin-arm64"]);
  });

  test("a wrong MLX_BUN_NATIVE tells the user what to run", () => {
    const r = runWith({ MLX_BUN_NATIVE: "/nonexistent/libmlxb.so" });
    expect(r.code).not.toBe(0);
    expect(r.err).toMatch(/MLX_BUN_NATIVE points at \/nonexistent\/libmlxb\.so.*tools\/setup\.sh/);
  });

  test("a library that cannot load (not a shared object) names the file and the set-up", () => {
    const bogus = `${process.env.TMPDIR ?? "/tmp"}/mlxb-bogus-${process.pid}.so`;
    require("node:fs").writeFileSync(bogus, "not a library");
    const r = runWith({ MLX_BUN_NATIVE: bogus });
    require("node:fs").rmSync(bogus);
    expect(r.code).not.toBe(0);
    expect(r.err).toMatch(/could not load .*mlxb-bogus.*tools\/setup\.sh/);
  });
});
