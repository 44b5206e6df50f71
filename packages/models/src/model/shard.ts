// Tensor-parallel Gemma 4 (docs/distributed.md), mirroring mlx-lm's `shard()` of llama.py /
// qwen3_moe.py: q/k/v and gate/up are "all-to-sharded" (this rank keeps a slice of the output
// features: its heads, its MLP columns), o_proj and down_proj are "sharded-to-all" (a slice of the
// input features, then an all_sum); MoE experts are sharded in place (every expert's columns
// split, one all_sum after the weighted expert sum). Embeddings, norms, the router, the per-layer
// input path and the output head stay whole on every rank, as the reference leaves them.
import type { MlxArray } from "@mlx-bun/mlx-ffi";
import { evaluate } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { ConfigError } from "../errors.ts";
import type { LoadedModel } from "../load.ts";
import type { ModuleWeights } from "./nn.ts";
import { releaseFused } from "./fused-linear.ts";

/** The all_sum of a sharded model's partial outputs; records them so a step can evaluate every collective. */
export class TensorParallel {
  #pending: MlxArray[] = [];
  constructor(readonly group: mx.distributed.Group) {}

  get rank(): number {
    return this.group.rank();
  }

  get size(): number {
    return this.group.size();
  }

  /** all_sum over the group (ShardedToAllLinear's reduction). */
  readonly reduce = (partial: MlxArray): MlxArray => {
    const y = mx.distributed.all_sum(partial, { group: this.group });
    this.#pending.push(y.retain());
    return y;
  };

  /**
   * The collectives issued since the last call (new handles; the caller disposes them). Every
   * rank must run the same collectives in the same order: evaluating these on each rank after a
   * forward does that whatever else the caller then evaluates (caches only, or the logits).
   */
  take(): MlxArray[] {
    const p = this.#pending;
    this.#pending = [];
    return p;
  }
}

type Mode = "all-to-sharded" | "sharded-to-all";

function check(cond: boolean, msg: string): void {
  if (!cond) throw new ConfigError(msg);
}

/**
 * Shard a loaded model across `group` in place: each sharded tensor in `loaded.weights.tensors`
 * is replaced by this rank's contiguous slice (the whole tensor is freed), the layer specs get
 * the local head counts, and sharded-to-all modules sum over the group. A size-1 group leaves the
 * model as it is. Head counts, MLP widths and quantization groups that do not divide by the
 * group size are a ConfigError naming the tensor.
 */
export function shardModel(loaded: LoadedModel, group: mx.distributed.Group): TensorParallel {
  const tp = new TensorParallel(group);
  const N = group.size();
  const r = group.rank();
  if (N === 1) return tp;
  const model = loaded.model;
  const tensors = loaded.weights.tensors;
  const paths = new Map([...model.modules].map(([p, m]) => [m, p]));
  for (const m of model.modules.values()) {
    if (m.lora) throw new ConfigError("tensor parallel: LoRA adapters are not supported on a sharded model");
  }
  for (const lw of model.parts.layers) {
    // Each rank keeps its slice of every part: the fused whole tensors go (fused-linear.ts).
    if (lw.fused) {
      for (const g of [lw.fused.qkv, lw.fused.gateUp]) if (g) releaseFused(g);
      delete lw.fused;
    }
    const spec = lw.spec;
    const where = `layer ${spec.index}`;
    check(spec.numHeads % N === 0, `tensor parallel: ${where} has ${spec.numHeads} attention heads, which do not divide by the group size ${N}`);
    if (spec.hasKv) {
      check(spec.numKvHeads % N === 0, `tensor parallel: ${where} has ${spec.numKvHeads} KV heads, which do not divide by the group size ${N}`);
    }
    const work: (() => void)[] = [];
    const plan = (m: ModuleWeights | undefined, mode: Mode, reduce: boolean): void => {
      if (m) work.push(shardModule(m, paths.get(m) ?? "?", mode, N, r, tensors, reduce ? tp.reduce : undefined));
    };
    plan(lw.q, "all-to-sharded", false);
    plan(lw.k, "all-to-sharded", false);
    plan(lw.v, "all-to-sharded", false);
    plan(lw.o, "sharded-to-all", true);
    plan(lw.gate, "all-to-sharded", false);
    plan(lw.up, "all-to-sharded", false);
    plan(lw.down, "sharded-to-all", true);
    if (lw.moe) {
      plan(lw.moe.gate, "all-to-sharded", false);
      plan(lw.moe.up, "all-to-sharded", false);
      // In place: no all_sum per expert; one after the weighted sum over the top-k.
      plan(lw.moe.down, "sharded-to-all", false);
      lw.moe.reduce = tp.reduce;
    }
    for (const w of work) w();
    lw.spec = { ...spec, numHeads: spec.numHeads / N, numKvHeads: spec.hasKv ? spec.numKvHeads / N : spec.numKvHeads };
  }
  return tp;
}

/**
 * Check one module's shapes now, return the step that replaces its tensors by this rank's slices
 * (contiguous copies, evaluated, the whole tensors freed). all-to-sharded splits the output axis
 * (-2: Linear [out, in], SwitchLinear [experts, out, in]); sharded-to-all the input axis (-1),
 * which for quantized weights must keep whole quantization groups on each rank.
 */
function shardModule(
  m: ModuleWeights,
  path: string,
  mode: Mode,
  N: number,
  r: number,
  tensors: Map<string, MlxArray>,
  reduce: ((x: MlxArray) => MlxArray) | undefined,
): () => void {
  const axis = mode === "all-to-sharded" ? -2 : -1;
  const parts: [keyof ModuleWeights & ("weight" | "scales" | "biases"), MlxArray][] = [["weight", m.weight]];
  if (m.scales) parts.push(["scales", m.scales]);
  if (m.biases) parts.push(["biases", m.biases]);
  for (const [name, a] of parts) {
    const d = a.shape[a.ndim + axis]!;
    check(
      d % N === 0,
      `tensor parallel: ${path}.${name} ${a.describe()} cannot be split ${mode} over ${N} ranks (axis ${axis} has ${d}${m.quant && name !== "weight" ? ` quantization groups of ${m.quant.groupSize}` : ""}, not divisible by ${N})`,
    );
  }
  return () => {
    const slices = parts.map(([name, a]) => {
      const pieces = mx.split(a, N, axis);
      try {
        return [name, mx.contiguous(pieces[r]!)] as const;
      } finally {
        for (const p of pieces) p.dispose();
      }
    });
    evaluate(...slices.map(([, s]) => s));
    for (const [name, s] of slices) {
      const key = `${path}.${name}`;
      const old = tensors.get(key);
      tensors.set(key, s);
      m[name] = s;
      if (old) old.dispose();
    }
    if (reduce) m.reduce = reduce;
  };
}
