import { Engine, PromptCache, Scheduler } from "@mlx-bun/runtime";
import { chatPromptIds } from "../src/prompt.ts";
const engine = Engine.load("/tmp/rb/tiny");
const promptCache = new PromptCache({ maxEntries: 10, maxBytes: 1 << 30 });
const scheduler = new Scheduler(engine, { maxBatch: 32, promptCache });
const kinds = (process.argv[2] ?? "0,4").split(",").map(Number);
let fails = 0; const msgs = new Set<string>();
const one = async (i: number) => {
  const kind = kinds[i % kinds.length]!;
  const ids = chatPromptIds(engine.loaded, [{ role: "user", content: `Tell me ${i % 5}` }]);
  const sampling: any = kind === 4 ? { temperature: 0.7, repetitionPenalty: 1.1, penaltyContext: 0, seed: i } : kind === 9 ? { temperature: 1, topK: 5, minP: 0.05 } : kind === 3 ? { temperature: 0.8, seed: i } : {};
  const ac = new AbortController();
  const s = scheduler.submit({ promptIds: ids, maxTokens: kind === 5 ? 64 : 16, sampling, stop: kind === 9 ? ["\n\n"] : [], signal: ac.signal, keepSpecialTokens: true });
  try { let n = 0; for await (const _ of s) { if (kind === 5 && ++n === 1) ac.abort(); } await s.result; } catch (e) { fails++; msgs.add((e as Error).message); }
};
let next = 0;
await Promise.all(Array.from({ length: 8 }, async () => { for (let i = next++; i < 300; i = next++) await one(i); }));
console.log(process.argv[2], "fails", fails, [...msgs]);
process.exit(0);
