// Generated forward plans: one module per known config (src/generated/), found by a key of the
// text config, so a known model runs straight-line code with its layer kinds baked in.
import { createHash } from "node:crypto";
import type { MlxArray } from "@mlx-bun/mlx-ffi";
import type { Cache } from "@mlx-bun/kv-cache";
import type { Gemma4Config, Gemma4TextConfig } from "../config.ts";
import { GENERATED_PLANS } from "../generated/index.ts";
import type { ModelConsts, ModelParts } from "./blocks.ts";

export interface ForwardPlan {
  /** The config it was generated for (tools/gen-model/configs/<name>.json). */
  readonly name: string;
  readonly key: string;
  forward(m: ModelParts, c: ModelConsts, ids: MlxArray, caches: Cache[] | null): MlxArray;
}

function stable(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(stable);
  if (v && typeof v === "object") return Object.fromEntries(Object.keys(v as object).sort().map((k) => [k, stable((v as Record<string, unknown>)[k])]));
  return v;
}

/** Identifies everything about a text config that the forward pass depends on. */
export function textConfigKey(t: Gemma4TextConfig): string {
  return createHash("sha256").update(JSON.stringify(stable(t))).digest("hex").slice(0, 16);
}

export function configKey(c: Gemma4Config): string {
  return textConfigKey(c.text);
}

/** The generated plan for this key, or null. */
export function findGeneratedPlan(key: string): ForwardPlan | null {
  return GENERATED_PLANS.find((p) => p.key === key) ?? null;
}
