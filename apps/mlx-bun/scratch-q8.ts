import { Engine, Scheduler } from "@mlx-bun/runtime";
for (const kv of ["q8", "q4", "turbo:4,4"]) {
  const engine = Engine.load("/work/main/.native/models/tiny-gemma4", { kv });
  const s = new Scheduler(engine);
  const tok = engine.loaded.tokenizer;
  const reqs = ["hello", "a longer prompt here", "x"].map((p) => ({ promptIds: tok.encode(p), maxTokens: 8 }));
  const solo = [];
  for (const r of reqs) solo.push((await s.submit(r).result).tokens);
  try {
    const together = await Promise.all(reqs.map((r) => s.submit(r).result));
    console.log(kv, together.map((t, i) => JSON.stringify(t.tokens) === JSON.stringify(solo[i])));
  } catch (e) { console.log(kv, "error", (e as Error).message); }
  await s.close(); engine.dispose();
}
