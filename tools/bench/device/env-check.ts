// What MLX will read for MLX_MAX_OPS_PER_BUFFER in this process once mlx-ffi has loaded (mlx-bun
// sets its default natively, where Bun's process.env does not reach): the libc environment.
import { dlopen, FFIType, ptr, CString } from "bun:ffi";
import { memory } from "@mlx-bun/mlx-ffi";
memory.active(); // loads the library (and applies mlx-bun's defaults)
const libc = dlopen("libc.so.6", { getenv: { args: [FFIType.ptr], returns: FFIType.ptr } });
const p = libc.symbols.getenv(ptr(Buffer.from("MLX_MAX_OPS_PER_BUFFER\0")));
console.log(`MLX_MAX_OPS_PER_BUFFER in this process: ${p ? new CString(p).toString() : "(unset)"}`);
