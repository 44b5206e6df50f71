// Hand-driven decode steps at batch 1 for the decode profilers (decode-profile.ts and
// device/decode-step-profile.ts): a prefilled state, one step, and the unpipelined step timed by phase.
import { asyncEval, evaluate, MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { type Engine, Sequence } from "@mlx-bun/runtime";

export interface StepState {
  caches: ReturnType<Engine["makeCaches"]>;
  seq: Sequence;
  /** The last sampled token, not yet fed. */
  tok: MlxArray;
}

/** Milliseconds per token spent building the graph, in the asyncEval call (kernel encoding) and waiting in item(). */
export interface StepPhases {
  build: number;
  asyncEval: number;
  wait: number;
}

export function decodeSteps(engine: Engine, prompt: readonly number[], maxTokens: number) {
  const { tokenizer } = engine.loaded;
  /** The prompt prefilled into fresh caches, its first token sampled and evaluated. */
  function prefilled(): StepState {
    const caches = engine.makeCaches();
    const seq = new Sequence({ promptIds: [...prompt], maxTokens }, tokenizer);
    using x = MlxArray.fromNumbers([...prompt], [1, prompt.length], "int32");
    using logits = engine.forward(x, caches);
    using row = mx.index(logits, ":", -1, ":");
    const p = seq.pick(row);
    p.logprobs.dispose();
    evaluate(p.token);
    return { caches, seq, tok: p.token };
  }
  /** The graph of the step that feeds `tok` (default: the state's last token). */
  function step(s: StepState, tok: MlxArray = s.tok) {
    using x = mx.expand_dims(tok, 0);
    using logits = engine.forward(x, s.caches);
    using row = mx.index(logits, ":", -1, ":");
    return s.seq.pick(row);
  }
  function done(s: StepState): void {
    s.tok.dispose();
    for (const c of s.caches) c.dispose();
    s.seq.dispose();
  }
  /** n unpipelined steps (build, asyncEval, item()); ms per token per phase, and their total. */
  function unpipelined(s: StepState, n: number): StepPhases & { total: number } {
    const ph: StepPhases = { build: 0, asyncEval: 0, wait: 0 };
    for (let i = 0; i < n; i++) {
      const a = performance.now();
      const p = step(s);
      const b = performance.now();
      asyncEval(p.token, p.logprobs);
      const c = performance.now();
      p.token.item();
      ph.build += b - a;
      ph.asyncEval += c - b;
      ph.wait += performance.now() - c;
      s.tok.dispose();
      p.logprobs.dispose();
      s.tok = p.token;
    }
    return { build: ph.build / n, asyncEval: ph.asyncEval / n, wait: ph.wait / n, total: (ph.build + ph.asyncEval + ph.wait) / n };
  }
  return { prefilled, step, done, unpipelined };
}
