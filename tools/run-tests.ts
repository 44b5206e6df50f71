// The README's test command: every package's vitest suite under the Bun runtime, then one line
// "N passed, N failed" derived from vitest's JSON report. Exit code: vitest's.
import { existsSync, readFileSync, rmSync } from "node:fs";
import { join, resolve } from "node:path";

const root = resolve(import.meta.dir, "..");
const report = join(root, ".vitest-report.json");
rmSync(report, { force: true });
const proc = Bun.spawnSync(
  [process.execPath, "x", "--bun", "vitest", "run", "--reporter=default", "--reporter=json", `--outputFile.json=${report}`, ...process.argv.slice(2)],
  { cwd: root, stdout: "inherit", stderr: "inherit", env: { ...process.env, FORCE_COLOR: process.env.CI ? "0" : "1" } },
);
let passed = 0;
let failed = 0;
let skipped = 0;
if (existsSync(report)) {
  const r = JSON.parse(readFileSync(report, "utf8")) as {
    numPassedTests: number;
    numFailedTests: number;
    numPendingTests: number;
    numTodoTests: number;
    testResults: { status: string; assertionResults: unknown[] }[];
  };
  passed = r.numPassedTests;
  // A file that fails to load (no test ran in it) counts as one failure.
  const brokenFiles = r.testResults.filter((f) => f.status === "failed" && f.assertionResults.length === 0).length;
  failed = r.numFailedTests + brokenFiles;
  skipped = r.numPendingTests + r.numTodoTests;
} else failed = 1;
const code = proc.exitCode ?? 1;
if (code !== 0 && failed === 0) failed = 1;
console.log(`${passed} passed, ${failed} failed${skipped ? `, ${skipped} skipped` : ""}`);
process.exit(code);
