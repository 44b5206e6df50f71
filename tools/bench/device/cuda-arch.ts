// What the exact kernels' "auto" settings resolve to here: the CUDA architecture mlx-ops sees (null
// off CUDA), and whether the model takes the fused exact norms and the exact-order matvec by default.
import * as mx from "@mlx-bun/mlx-ops";

const k = mx.kernels;
console.log(JSON.stringify({ cuda_arch: k.cuda_arch(), exact_norms: k.exact_norms_enabled(), exact_qmv: k.fast_qmv_enabled() }));
