// TurboQuant's per-step encode of one decode token (issue 24): the codec's planes of the new
// key/value rows of a full-attention layer of the 12B shape ([1, 8, 1, 512] bfloat16), encoded
// by the kernel ("kernel") and the composition op by op ("composition"), interleaved. Per call:
// graph building (µs, no evaluation) and building + evaluation (µs); min / median / max. Then
// the planes of the two, compared byte for byte.
//   bun tools/bench/device/turbo-encode.ts [--calls 200] [--heads 8] [--dim 512]
import { evaluate, type MlxArray } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";
import { turboQuantCodec } from "@mlx-bun/kv-cache";
import { formatSpread } from "../stats.ts";

const argv = process.argv.slice(2);
const opt = (name: string, def: number): number => {
  const i = argv.indexOf(`--${name}`);
  return i >= 0 ? Number(argv[i + 1]) : def;
};
const CALLS = opt("calls", 200);
const HEADS = opt("heads", 8);
const DIM = opt("dim", 512);

const NAMES = ["kernel", "composition"] as const;
type Name = (typeof NAMES)[number];
const codecs = Object.fromEntries(NAMES.map((n) => [n, turboQuantCodec({ kBits: 4, vBits: 3, encoding: n })])) as Record<
  Name,
  ReturnType<typeof turboQuantCodec>
>;
const times = Object.fromEntries(NAMES.map((n) => [n, { build: [] as number[], whole: [] as number[] }])) as Record<Name, { build: number[]; whole: number[] }>;

using k0 = mx.random.normal([1, HEADS, 1, DIM]);
using k = mx.astype(k0, "bfloat16");
using v0 = mx.random.normal([1, HEADS, 1, DIM]);
using v = mx.astype(v0, "bfloat16");
evaluate(k, v);

function once(name: Name, record: boolean): void {
  const t0 = performance.now();
  const planes: MlxArray[] = codecs[name].encode(k, v);
  const t1 = performance.now();
  evaluate(...planes);
  const t2 = performance.now();
  for (const p of planes) p.dispose();
  if (record) {
    times[name].build.push((t1 - t0) * 1000);
    times[name].whole.push((t2 - t0) * 1000);
  }
}

for (let i = 0; i < 20; i++) for (const n of NAMES) once(n, false);
for (let i = 0; i < CALLS; i++) for (let j = 0; j < NAMES.length; j++) once(NAMES[(i + j) % NAMES.length]!, true);

console.log(`turbo:4,3 encode of [1, ${HEADS}, 1, ${DIM}] bfloat16, ${CALLS} calls each (µs, min / median / max)`);
for (const n of NAMES) console.log(`${n.padEnd(9)} build ${formatSpread(times[n].build, 1)}   build + eval ${formatSpread(times[n].whole, 1)}`);
// Bytes: the kernel's planes against the composition's, on prefill-sized chunks too.
for (const t of [1, 16, 300]) {
  using a0 = mx.random.normal([1, HEADS, t, DIM]);
  using a = mx.astype(a0, "bfloat16");
  const [pk, pe] = [codecs.kernel.encode(a, a), codecs.composition.encode(a, a)];
  const same = pk.map((p, i) => {
    using eq = mx.equal(p, pe[i]!);
    using all = mx.all(eq);
    return all.item() === 1;
  });
  console.log(`${t} token(s): kernel planes = composition planes: ${same.join(" ")}`);
  for (const p of [...pk, ...pe]) p.dispose();
}
for (const c of Object.values(codecs)) c.dispose();
