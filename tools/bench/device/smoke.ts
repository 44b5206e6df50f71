// Smoke test on the device machine: the native library loads, MLX's default device, one op.
import { defaultDevice, evaluate, mlxVersion } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";

using a = mx.random.uniform(0, 1, [1024]);
using b = mx.add(a, 1);
evaluate(b);
using s = mx.sum(b);
console.log(`mlx-bun smoke: MLX ${mlxVersion()}, default device ${defaultDevice()}, sum ${s.item().toFixed(1)} (expect ~1536)`);
