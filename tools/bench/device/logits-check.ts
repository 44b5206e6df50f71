// mlx-bun's Gemma 4 logits against mlx-lm's on whatever backend is live (made for CUDA, where
// compiled/fused kernels can change results): prefill a prompt, decode greedily, compare every
// step's logits (max |diff|) and the greedy tokens. The same comparison the model tests make on
// the CPU (packages/models/test/forward.test.ts), as a script for the device machine.
//   .native/bin/bun tools/bench/device/logits-check.ts --model DIR [--kv bf16] [--steps 32] [--prompt 64]
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { defaultDevice, loadSafetensors, MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { Gemma4Model, loadGemma4Config, loadWeights, parseKvMode } from "@mlx-bun/models";
import { runPython } from "../../oracle/oracle.ts";
import { maxAbsDiff } from "../../oracle/compare.ts";

const arg = (f: string, d: string) => {
  const i = process.argv.indexOf(`--${f}`);
  return i >= 0 ? process.argv[i + 1]! : d;
};
const ckpt = arg("model", "");
if (!ckpt) throw new Error("logits-check: --model DIR is required");
const kv = arg("kv", "bf16");
const STEPS = Number(arg("steps", "32"));
const PROMPT = Array.from({ length: Number(arg("prompt", "64")) }, (_, i) => 5 + ((i * 37) % 200));
const ROOT = join(import.meta.dir, "..", "..", "..");
const dir = mkdtempSync(join(tmpdir(), "mlxb-logits-"));
try {
  const out = join(dir, "ref.safetensors");
  const t0 = performance.now();
  runPython([join(ROOT, "tools", "oracle", "gemma4_logits.py"), ckpt, out, "--ids", PROMPT.join(","), "--steps", String(STEPS), "--kv", kv]);
  const tRef = performance.now() - t0;
  using ref = loadSafetensors(out);
  const refLogits = ref.tensors.get("logits")!;
  const refTokens = ref.tensors.get("tokens")!.tolist() as number[];

  const config = loadGemma4Config(ckpt);
  using weights = loadWeights(ckpt, config);
  using model = new Gemma4Model(config, weights.tensors);
  const caches = model.makeCaches(parseKvMode(kv), { slidingMode: parseKvMode("bf16") });
  const diffs: number[] = [];
  const tokens: number[] = [];
  using ids0 = MlxArray.fromNumbers(PROMPT, [1, PROMPT.length], "int32");
  let logits = model.forward(ids0, caches).eval();
  for (let i = 0; i <= STEPS; i++) {
    using last = mx.index(logits, 0, -1);
    using refRow = mx.index(refLogits, i);
    diffs.push(maxAbsDiff(last, refRow));
    logits.dispose();
    if (i === STEPS) break;
    // Teacher-forced on mlx-lm's tokens so one early flip does not make every later row differ.
    using am = mx.argmax(last, -1);
    tokens.push(am.item());
    using ids = MlxArray.fromNumbers([refTokens[i]!], [1, 1], "int32");
    logits = model.forward(ids, caches).eval();
  }
  for (const c of caches) c.dispose();
  const same = tokens.filter((t, i) => t === refTokens[i]).length;
  const exact = diffs.filter((d) => d === 0).length;
  console.log(
    JSON.stringify({
      device: defaultDevice(),
      model: ckpt,
      kv,
      steps: STEPS,
      greedyAgreement: `${same}/${tokens.length}`,
      rowsBitExact: `${exact}/${diffs.length}`,
      maxAbsDiff: Math.max(...diffs),
      firstDiffs: diffs.slice(0, 8),
      referenceSeconds: +(tRef / 1000).toFixed(1),
    }),
  );
} finally {
  rmSync(dir, { recursive: true, force: true });
}
