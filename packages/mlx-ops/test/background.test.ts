import { describe, expect, test } from "vitest";
import { type BackgroundJob, MlxArray, Stream, asyncEvalInBackground, evaluate, joinBackground, memory } from "@mlx-bun/mlx-ffi";
import { add, multiply } from "../src/index.ts";

// Background evaluation (docs/background-eval.md): async_eval on a native worker thread while this
// thread builds the next graph; the worker reads the previous step's values.
describe("background evaluation", () => {
  test("a chain of steps built while the previous one is scheduled: each job reads its input's value (closed form)", () => {
    const base = memory.active();
    let x = MlxArray.fromNumbers([1], [1], "float32");
    const jobs: BackgroundJob[] = [];
    let sum = 0;
    for (let i = 0; i < 300; i++) {
      using one = MlxArray.fromNumbers([1], [1], "float32");
      const y = add(x, one);
      const job = asyncEvalInBackground([y], [x]);
      jobs.push(job);
      // Built while the worker schedules y: depends on y without reading it.
      using z = multiply(y, y);
      sum += job.values()[0]!;
      void z;
      x.dispose();
      x = y;
    }
    // x went 1, 2, ..., 300 before each step; the last value is 301.
    expect(sum).toBe((300 * 301) / 2);
    expect(x.item()).toBe(301);
    // An earlier job's values stay readable for a while.
    expect(jobs.at(-3)!.values()).toEqual([298]);
    expect(() => jobs[0]!.values()).toThrow(/too old/);
    x.dispose();
    joinBackground();
    expect(memory.active()).toBe(base);
  });

  test("a job without reads; several outputs; reads of size 1 only", () => {
    using a = MlxArray.fromNumbers([1, 2, 3], [3], "float32");
    using b = add(a, a);
    using c = multiply(b, a);
    expect(asyncEvalInBackground([b, c]).values()).toEqual([]);
    expect(c.tolist()).toEqual([2, 8, 18]);
    using d = add(c, a);
    expect(() => asyncEvalInBackground([d], [d])).toThrow(/background read 0 has size 3, not 1/);
  });

  test("an error of the background job is raised at the next join, naming it; later work is unaffected", () => {
    // A stream made on this thread the ordinary way: MLX keeps its encoder per thread, so the worker cannot run it.
    using own = Stream.create("cpu");
    using a = MlxArray.fromNumbers([1, 2], [2], "float32");
    using b = add(a, a, own);
    asyncEvalInBackground([b]);
    expect(() => evaluate(a)).toThrow(/an earlier background async_eval failed: .*Stream\(cpu/);
    using c = add(a, a);
    expect(asyncEvalInBackground([c]).values()).toEqual([]);
    expect(c.tolist()).toEqual([2, 4]);
  });
});
