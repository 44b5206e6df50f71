// Prompt reuse across chat turns against mlx_lm.server on the same tiny checkpoint (8-token
// sliding window, so every turn's cache has wrapped): per request, mlx-bun's cached_tokens >=
// mlx_lm.server's (tools/bench/multi-turn-cache.ts; docs/server.md has both models' figures).
import { join } from "node:path";
import { afterAll, beforeAll, expect, test } from "vitest";
import { compareSides } from "../../../tools/bench/multi-turn-cache.ts";
import { makeTinySmall, tempDir } from "./helpers.ts";

let tmp: ReturnType<typeof tempDir>;
let dir: string;
beforeAll(() => {
  tmp = tempDir("mlxb-turns-");
  dir = makeTinySmall(join(tmp.path, "tiny"));
});
afterAll(() => tmp?.cleanup());

test("three-turn chat and a repeated prompt: cached_tokens >= mlx_lm.server's", async () => {
  const { ours, theirs } = await compareSides(dir, { words: 120, maxTokens: 24 });
  expect(ours.map((o) => o.promptTokens)).toEqual(theirs.map((t) => t.promptTokens));
  ours.forEach((o, i) => expect(o.cachedTokens, o.label).toBeGreaterThanOrEqual(theirs[i]!.cachedTokens));
  // Reuse happens at all: each later turn reuses at least the previous turn's prompt but its last token.
  expect(ours[1]!.cachedTokens).toBeGreaterThanOrEqual(ours[0]!.promptTokens - 1);
  expect(ours[2]!.cachedTokens).toBeGreaterThanOrEqual(ours[1]!.promptTokens - 1);
  expect(ours[3]!.cachedTokens).toBe(ours[3]!.promptTokens - 1);
}, 180_000);
