// Prints the MLX version, the devices, and a small computation: `bun packages/mlx-ffi/examples/info.ts`.
import { MlxArray, defaultDevice, isDeviceAvailable, memory, mlxVersion } from "@mlx-bun/mlx-ffi";

console.log(`mlx ${mlxVersion()} · default device ${defaultDevice()} · gpu ${isDeviceAvailable("gpu") ? "available" : "not available"}`);
using a = MlxArray.fromNumbers([1, 2, 3, 4], [2, 2], "bfloat16");
console.log(`${a.describe()} = ${JSON.stringify(a.tolist())}`);
console.log(`MLX active memory: ${memory.active()} bytes`);
