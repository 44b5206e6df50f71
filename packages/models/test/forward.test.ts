import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { loadSafetensors, MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { Gemma4Model, loadGemma4Config, loadWeights, parseKvMode } from "../src/index.ts";
import { runPython } from "../../../tools/oracle/oracle.ts";
import { maxAbsDiff } from "../../../tools/oracle/compare.ts";
import { MAKER, ROOT } from "./helpers.ts";

// Parity with mlx-lm runs on the exact path: prefill chunks over a quantized cache attend with
// mlx-lm's quantized-matmul attention, not SDPA over the dequantized planes (docs/kv-prefill.md).
process.env.MLX_BUN_KV_PREFILL = "exact";

const dir = mkdtempSync(join(tmpdir(), "mlxb-fwd-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const PROMPT = Array.from({ length: 64 }, (_, i) => 5 + ((i * 37) % 200));
const STEPS = 50;

function reference(ckpt: string, kv: string, chunk = 0): { logits: MlxArray; tokens: number[]; dispose(): void } {
  const out = join(dir, `ref-${Math.random().toString(36).slice(2)}.safetensors`);
  runPython([
    join(ROOT, "tools", "oracle", "gemma4_logits.py"),
    ckpt,
    out,
    "--ids",
    PROMPT.join(","),
    "--steps",
    String(STEPS),
    "--kv",
    kv,
    ...(chunk ? ["--chunk", String(chunk)] : []),
  ]);
  const l = loadSafetensors(out);
  const logits = l.tensors.get("logits")!.eval();
  const tokens = l.tensors.get("tokens")!.tolist() as number[];
  return { logits, tokens, dispose: () => l[Symbol.dispose]() };
}

function ours(ckpt: string, kv: string, chunk = 0): { rows: MlxArray[]; tokens: number[] } {
  const config = loadGemma4Config(ckpt);
  using weights = loadWeights(ckpt, config);
  using model = new Gemma4Model(config, weights.tensors);
  // mlx-lm quantizes only the full-attention KVCache (its RotatingKVCache has no quantized form).
  const caches = model.makeCaches(parseKvMode(kv), { slidingMode: parseKvMode("bf16") });
  const rows: MlxArray[] = [];
  const tokens: number[] = [];
  try {
    const step = chunk || PROMPT.length;
    let logits: MlxArray | undefined;
    for (let s = 0; s < PROMPT.length; s += step) {
      logits?.dispose();
      using ids = MlxArray.fromNumbers(PROMPT.slice(s, s + step), [1, Math.min(step, PROMPT.length - s)], "int32");
      logits = model.forward(ids, caches).eval();
    }
    for (let i = 0; i <= STEPS; i++) {
      const last = mx.index(logits!, 0, -1);
      rows.push(last.eval());
      logits!.dispose();
      if (i === STEPS) break;
      using am = mx.argmax(last, -1);
      const tok = am.item();
      tokens.push(tok);
      using ids = MlxArray.fromNumbers([tok], [1, 1], "int32");
      logits = model.forward(ids, caches).eval();
    }
    return { rows, tokens };
  } finally {
    for (const c of caches) c.dispose();
  }
}

const made = new Map<string, string>();
beforeAll(() => {
  for (const [name, args] of [
    ["small-bf16", ["--variant", "small"]],
    ["small-4bit", ["--variant", "small", "--quant", "4bit"]],
    ["dense-bf16", ["--variant", "dense"]],
    ["dense-4bit", ["--variant", "dense", "--quant", "4bit"]],
    ["moe-f32", ["--variant", "moe", "--dtype", "float32"]],
    ["moe-4bit", ["--variant", "moe", "--quant", "4bit", "--dtype", "float32"]],
  ] as const) {
    const out = join(dir, name);
    runPython([MAKER, "--out", out, ...args]);
    made.set(name, out);
  }
});

describe("Gemma 4 forward = mlx-lm (64-token prompt, 50 greedy tokens, every step's logits)", () => {
  const cases: [string, string, number?][] = [
    ["small-bf16", "bf16"],
    ["small-bf16", "bf16", 24],
    ["small-4bit", "bf16"],
    ["dense-bf16", "bf16"],
    ["dense-bf16", "q8"],
    ["dense-bf16", "q4"],
    ["dense-4bit", "bf16"],
    ["moe-f32", "bf16"],
    ["moe-4bit", "bf16"],
    ["moe-4bit", "q8"],
  ];
  for (const [name, kv, chunk] of cases) {
    test(`${name}, kv ${kv}${chunk ? `, prefill chunks of ${chunk}` : ""}: bit-exact logits, identical tokens`, () => {
      const ckpt = made.get(name)!;
      const ref = reference(ckpt, kv, chunk);
      const mine = ours(ckpt, kv, chunk);
      try {
        expect(mine.tokens).toEqual(ref.tokens);
        using stacked = mx.stack(mine.rows, 0);
        expect(stacked.dtype).toBe(ref.logits.dtype);
        expect(maxAbsDiff(stacked, ref.logits)).toBe(0);
      } finally {
        for (const r of mine.rows) r.dispose();
        ref.dispose();
      }
    });
  }
});

// The fused exact norms (mlx-ops norm-exact.ts) routed everywhere: on this CPU their reference
// composition, so this checks the model's routing (which tensors, heads, weights and residuals
// each launch takes), at decode (fused q/k/v) and prefill; the CUDA bodies' bits are checked
// against MLX by tools/kernels/check_cuda_kernels.py.
describe("Gemma 4 forward with the exact norm kernels' routing = mlx-lm", () => {
  for (const name of ["small-4bit", "dense-4bit", "moe-4bit"]) {
    test(`${name}: bit-exact logits, identical tokens`, () => {
      const ckpt = made.get(name)!;
      const ref = reference(ckpt, "bf16");
      mx.kernels.set_exact_norms("always");
      try {
        expect(mx.kernels.exact_norms_enabled()).toBe(true);
        const mine = ours(ckpt, "bf16");
        try {
          expect(mine.tokens).toEqual(ref.tokens);
          using stacked = mx.stack(mine.rows, 0);
          expect(maxAbsDiff(stacked, ref.logits)).toBe(0);
        } finally {
          for (const r of mine.rows) r.dispose();
        }
      } finally {
        mx.kernels.set_exact_norms(undefined);
        ref.dispose();
      }
    });
  }
});

describe("LoRA adapters (mlx-lm format)", () => {
  test("an adapter made by mlx-lm's tuner gives mlx-lm's logits exactly, and unloading restores the base", async () => {
    const { loadAdapter } = await import("../src/index.ts");
    const ckpt = made.get("dense-bf16")!;
    const adapterDir = join(dir, "adapter");
    const out = join(dir, "lora-ref.safetensors");
    runPython([
      join(ROOT, "tools", "oracle", "lora_oracle.py"),
      ckpt,
      adapterDir,
      out,
      "--ids",
      PROMPT.join(","),
      "--layers",
      "2",
      "--rank",
      "4",
      "--scale",
      "3.0",
    ]);
    using ref = loadSafetensors(out);
    const config = loadGemma4Config(ckpt);
    using weights = loadWeights(ckpt, config);
    using model = new Gemma4Model(config, weights.tensors);
    using ids = MlxArray.fromNumbers(PROMPT, [1, PROMPT.length], "int32");
    using base = model.forward(ids).eval();
    const adapter = loadAdapter(model, adapterDir);
    expect(adapter.modules.length).toBeGreaterThan(0);
    using withLora = model.forward(ids);
    expect(maxAbsDiff(withLora, ref.tensors.get("logits")!)).toBe(0);
    expect(maxAbsDiff(withLora, base)).toBeGreaterThan(0);
    adapter.dispose();
    using again = model.forward(ids);
    expect(maxAbsDiff(again, base)).toBe(0);
    expect(() => loadAdapter(model, join(dir, "nope"))).toThrow(/adapter_config\.json: not found/);
  });
});
