// Write the kernel sources of packages/mlx-ops and packages/kv-cache (name, input/output names, Metal and CUDA bodies)
// to a JSON file, so a GPU machine without Bun can try them through Python MLX:
//   bun tools/kernels/export-sources.ts out.json && python tools/kernels/check_cuda_kernels.py out.json
import { geglu_kernel } from "../../packages/mlx-ops/src/kernels/geglu.ts";
import { qmv_kernel } from "../../packages/mlx-ops/src/kernels/qmv.ts";
import { qmv_exact_geglu_kernel, qmv_exact_kernel } from "../../packages/mlx-ops/src/kernels/qmv-exact.ts";
import { q_norm_kernel, qkv_norm_kernel, residual_norm_kernel } from "../../packages/mlx-ops/src/kernels/norm-exact.ts";
import { sdpa_decode_scores_kernel, sdpa_decode_values_kernel } from "../../packages/mlx-ops/src/kernels/sdpa-decode.ts";
import { LLOYD_MAX_GAUSSIAN } from "../../packages/mlx-ops/src/turboquant.ts";
import { affineDecodeKernel } from "../../packages/kv-cache/src/kernels/affine-decode.ts";
import { decodeCombineKernel } from "../../packages/kv-cache/src/kernels/decode-combine.ts";
import { turboDecodeKernel } from "../../packages/kv-cache/src/kernels/turbo-decode.ts";
import { turboEncodeKernel } from "../../packages/kv-cache/src/kernels/turbo-encode.ts";
import { turboUnrotateKernel } from "../../packages/kv-cache/src/kernels/turbo-unrotate.ts";
import { turboValuesKernel } from "../../packages/kv-cache/src/kernels/turbo-values.ts";
import { denseDecodeKernel } from "../../packages/kv-cache/src/kernels/dense-decode.ts";

const out = process.argv[2] ?? "kernel-sources.json";
const kernels = [
  geglu_kernel,
  qmv_kernel,
  qmv_exact_kernel,
  qmv_exact_geglu_kernel,
  // The constants (heads, eps) are template arguments: any instance carries the source.
  qkv_norm_kernel({ hq: 1, hk: 1, hv: 1, dim: 256, eps: 1e-6 }),
  q_norm_kernel({ hq: 1, dim: 256, eps: 1e-6 }),
  residual_norm_kernel({ eps: 1e-6, scaled: false, next: true }),
  residual_norm_kernel({ eps: 1e-6, scaled: false, next: false }),
  sdpa_decode_scores_kernel,
  sdpa_decode_values_kernel,
  turboValuesKernel,
  turboEncodeKernel,
  turboUnrotateKernel,
  affineDecodeKernel,
  turboDecodeKernel,
  denseDecodeKernel,
  decodeCombineKernel,
].map(({ spec }) => ({
  name: spec.name,
  input_names: spec.input_names,
  output_names: spec.output_names,
  ensure_row_contiguous: spec.ensure_row_contiguous !== false,
  metal: spec.metal ?? null,
  cuda: spec.cuda ?? null,
  // The encode kernel runs with the codec's Lloyd-Max boundaries: the checker drives it with them.
  ...(spec.name === turboEncodeKernel.name
    ? { codebook_boundaries: Object.fromEntries(Object.entries(LLOYD_MAX_GAUSSIAN).map(([bits, book]) => [bits, book.boundaries])) }
    : {}),
}));
await Bun.write(out, JSON.stringify(kernels, null, 1));
console.log(`wrote ${kernels.length} kernel(s) to ${out}`);
