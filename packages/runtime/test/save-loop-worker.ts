// The writer of kill-during-save.test.ts: saves the same prompt cache to one path over and over
// (about 48 MB a save, so a kill often lands between the temporary file's write and its rename).
// Prints "ready" once the caches exist, then "saved <n>" after each save.
import { KVCache } from "@mlx-bun/kv-cache";
import { evaluate } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { savePromptCache } from "@mlx-bun/runtime";

const [path, fingerprint] = process.argv.slice(2) as [string, string];
const LAYERS = 3;
const TOKENS = 2048;
const caches = Array.from({ length: LAYERS }, (_, i) => {
  const c = new KVCache();
  using key = mx.random.key(i);
  using k = mx.random.normal([1, 2, TOKENS, 512], { dtype: "bfloat16", key });
  using v = mx.random.normal([1, 2, TOKENS, 512], { dtype: "bfloat16", loc: 1, key });
  using view = c.updateAndFetch(k, v);
  evaluate(...view.planes);
  return c;
});
const tokens = Array.from({ length: TOKENS }, (_, i) => (i * 7919) % 1000);
process.stdout.write("ready\n");
for (let n = 1; ; n++) {
  savePromptCache(path, { fingerprint, caches, tokens });
  process.stdout.write(`saved ${n}\n`);
}
