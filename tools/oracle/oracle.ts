// Test client of tools/oracle/mlx_oracle.py: run Python MLX on the same inputs, get its arrays back.
import { mkdtempSync, rmSync, writeFileSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { loadSafetensors, MlxArray, saveSafetensors } from "@mlx-bun/mlx-ffi";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));

/** The project's venv Python (set up by tools/setup.sh). */
export function oraclePython(): string {
  const py = process.env.MLX_BUN_PYTHON ?? join(ROOT, ".native", "venv", "bin", "python");
  if (!existsSync(py)) throw new Error(`oracle: ${py} not found; run bash tools/setup.sh`);
  return py;
}

/** Run a Python script of tools/oracle (or any path) with the venv Python; returns stdout, throws on failure. */
export function runPython(args: string[], opts: { cwd?: string; env?: Record<string, string> } = {}): string {
  const p = Bun.spawnSync([oraclePython(), ...args], {
    cwd: opts.cwd ?? ROOT,
    env: { ...process.env, ...opts.env },
    stdout: "pipe",
    stderr: "pipe",
  });
  if (p.exitCode !== 0) throw new Error(`python ${args.join(" ")} failed (${p.exitCode}):\n${p.stderr.toString()}`);
  return p.stdout.toString();
}

/** runPython without blocking the event loop (for a Python client of a server running in this process). */
export async function runPythonAsync(args: string[], opts: { cwd?: string; env?: Record<string, string> } = {}): Promise<string> {
  const p = Bun.spawn([oraclePython(), ...args], { cwd: opts.cwd ?? ROOT, env: { ...process.env, ...opts.env }, stdout: "pipe", stderr: "pipe" });
  const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  if (code !== 0)
    throw new Error(`python ${args.join(" ")} failed (${code}):
${err}`);
  return out;
}

/** What the oracle returned: arrays by case id (tuple results as "<id>.<i>") and errors by case id. */
export interface OracleResult extends Disposable {
  get(id: string): MlxArray;
  has(id: string): boolean;
  error(id: string): string | undefined;
}

/**
 * Evaluate `cases` (id → Python expression over `mx`, `np` and the inputs by
 * name) in Python MLX, in one process for the whole batch.
 */
export function oracle(inputs: Record<string, MlxArray>, cases: Record<string, string>): OracleResult {
  const dir = mkdtempSync(join(tmpdir(), "mlxb-oracle-"));
  try {
    const casesPath = join(dir, "cases.json");
    const inPath = join(dir, "in.safetensors");
    const outPath = join(dir, "out.safetensors");
    writeFileSync(casesPath, JSON.stringify(cases));
    if (Object.keys(inputs).length) saveSafetensors(inPath, inputs);
    runPython([join(ROOT, "tools", "oracle", "mlx_oracle.py"), casesPath, Object.keys(inputs).length ? inPath : "-", outPath]);
    const loaded = loadSafetensors(outPath);
    for (const [k, a] of loaded.tensors) {
      a.eval(); // read before the temp dir goes
      if (loaded.metadata[`dtype:${k}`] === "float64") {
        loaded.tensors.set(k, MlxArray.fromTypedArray(a.toTypedArray(), a.shape, "float64"));
        a.dispose();
      }
    }
    return {
      get(id) {
        const a = loaded.tensors.get(id);
        if (!a) throw new Error(`oracle: no result for '${id}'${loaded.metadata[`error:${id}`] ? `: ${loaded.metadata[`error:${id}`]}` : ""}`);
        return a;
      },
      has: (id) => loaded.tensors.has(id),
      error: (id) => loaded.metadata[`error:${id}`],
      [Symbol.dispose]: () => loaded[Symbol.dispose](),
    };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** One step of a cache script: an update (with an optional query for attention) or a trim. */
export type CacheStep = { k: string; v: string; q?: string; window?: number } | { trim: number };

/** What mlx-lm's cache did at each step: fetched planes, masks, attention, offsets. */
export interface CacheOracleResult extends Disposable {
  get(id: string): MlxArray | undefined;
  meta(id: string): string | undefined;
}

/** Replay `steps` on mlx-lm's cache class `kind` (tools/oracle/cache_oracle.py). */
export function cacheOracle(
  kind: "KVCache" | "RotatingKVCache" | "QuantizedKVCache",
  args: Record<string, number>,
  inputs: Record<string, MlxArray>,
  steps: CacheStep[],
  scale = 1,
): CacheOracleResult {
  return runCacheScript("cache_oracle.py", { kind, args, steps, scale }, inputs);
}

/** Run a cache oracle script on a JSON script and input arrays; read back its arrays and metadata. */
function runCacheScript(script: string, json: unknown, inputs: Record<string, MlxArray>): CacheOracleResult {
  const dir = mkdtempSync(join(tmpdir(), "mlxb-cache-oracle-"));
  try {
    const scriptPath = join(dir, "script.json");
    const inPath = join(dir, "in.safetensors");
    const outPath = join(dir, "out.safetensors");
    writeFileSync(scriptPath, JSON.stringify(json));
    saveSafetensors(inPath, inputs);
    runPython([join(ROOT, "tools", "oracle", script), scriptPath, inPath, outPath]);
    const loaded = loadSafetensors(outPath);
    for (const a of loaded.tensors.values()) a.eval();
    return {
      get: (id) => loaded.tensors.get(id),
      meta: (id) => loaded.metadata[id],
      [Symbol.dispose]: () => loaded[Symbol.dispose](),
    };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** One step of a batched cache script (tools/oracle/batch_cache_oracle.py). */
export type BatchCacheStep =
  | { k: string; v: string; q?: string; window?: number }
  | { trim: number }
  | { prepare: { left_padding?: number[]; lengths?: number[]; right_padding?: number[] } }
  | { finalize: true }
  | { filter: number[] }
  | { extend: string }
  | { merge: string[] }
  | { extract: number };

/** An auxiliary cache of a scenario (a row source for merge, or the other batch of an extend). */
export interface AuxCacheSpec {
  kind: "KVCache" | "RotatingKVCache" | "BatchKVCache" | "BatchRotatingKVCache";
  args?: Record<string, number | number[]>;
  steps?: BatchCacheStep[];
}

export interface BatchScenario {
  kind: "BatchKVCache" | "BatchRotatingKVCache";
  /** Constructor args (left_padding, max_size); omit when the first step is a merge. */
  args?: { left_padding?: number[]; max_size?: number };
  /** Quantize mlx-lm's fetched K/V (the reference for an affine codec over the same layout). */
  quantize?: { bits: number; group_size: number };
  caches?: Record<string, AuxCacheSpec>;
  steps: BatchCacheStep[];
}

/** Replay batched scenarios on mlx-lm's BatchKVCache / BatchRotatingKVCache in one Python process; ids are "<scenario>/<step>.<what>". */
export function batchCacheOracle(scenarios: Record<string, BatchScenario>, inputs: Record<string, MlxArray>, scale = 1): CacheOracleResult {
  return runCacheScript("batch_cache_oracle.py", { scenarios, scale }, inputs);
}
