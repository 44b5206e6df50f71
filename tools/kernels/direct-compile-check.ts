// Compile, without a GPU, the sources direct launches build (packages/mlx-ffi/native/src/kernel_direct.cpp):
// MLX's generated kernel source (its build_kernel, restated here: default header, header, the
// signature, the template constants, the body) with MLX's utils.cuh include replaced by the prelude
// kernel_direct.cpp defines, through NVRTC with MLX's options, for the launches a 12B-shaped decode
// step makes (the exact matvec at its shapes, the residual norm). Uses the NVRTC 12.9 and CUDA headers that
// `python tools/kernels/ptxas_regs.py --setup` downloads into .native/cuda-ptxas. Exits 1 on a failure.
//   bun tools/kernels/direct-compile-check.ts
import { dlopen, FFIType, type Pointer, ptr } from "bun:ffi";
import { existsSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import type { Dtype, MlxArray } from "@mlx-bun/mlx-ffi";
import { zeros } from "@mlx-bun/mlx-ops";
import type { CustomKernel, TemplateArg } from "../../packages/mlx-ops/src/kernels/kernel.ts";
import { residual_norm_kernel } from "../../packages/mlx-ops/src/kernels/norm-exact.ts";
import { qmv_exact_kernel } from "../../packages/mlx-ops/src/kernels/qmv-exact.ts";

const ROOT = resolve(import.meta.dir, "..", "..");
const NV = join(ROOT, ".native", "cuda-ptxas", "nvidia");
const libPath = join(NV, "cuda_nvrtc", "lib", "libnvrtc.so.12");
if (!existsSync(libPath)) {
  console.log(`no ${libPath}: run python tools/kernels/ptxas_regs.py --setup first`);
  process.exit(2);
}

// The prelude and the include it replaces, read from kernel_direct.cpp (one definition of each).
const cpp = readFileSync(join(ROOT, "packages/mlx-ffi/native/src/kernel_direct.cpp"), "utf8");
const PRELUDE = /PRELUDE = R"\(([\s\S]*?)\)";/.exec(cpp)![1]!;
const UTILS = JSON.parse(/MLX_UTILS_INCLUDE = ("(?:[^"\\]|\\.)*");/.exec(cpp)![1]!) as string;

const CUDA_TYPE: Partial<Record<Dtype, string>> = {
  float32: "float",
  float16: "__half",
  bfloat16: "__nv_bfloat16",
  uint32: "uint32_t",
  int32: "int32_t",
  uint8: "uint8_t",
  bool: "bool",
};
const cudaType = (d: Dtype): string =>
  CUDA_TYPE[d] ??
  (() => {
    throw new Error(`no CUDA type for ${d}`);
  })();

/** MLX 0.32's build_kernel (mlx/backend/cuda/custom_kernel.cpp) for one launch. */
function mlxSource(k: CustomKernel, inputs: MlxArray[], template: readonly (readonly [string, TemplateArg])[], outDtypes: readonly Dtype[]): [string, string] {
  const { spec } = k;
  const body = spec.cuda!.source;
  const hash = template.map(([, v]) => (typeof v === "boolean" ? (v ? "_t" : "_f") : `_${v}`)).join("");
  const name = `custom_kernel_${spec.name}${hash}`;
  let s = `\n${UTILS}\n\n#include <cooperative_groups.h>\n\n${spec.cuda!.header ?? ""}namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n__global__ void ${name}(\n`;
  spec.input_names.forEach((n, i) => {
    s += `    const ${cudaType(inputs[i]!.dtype)}* ${n},\n`;
    if (inputs[i]!.ndim > 0) {
      if (body.includes(`${n}_shape`)) s += `    const __grid_constant__ Shape ${n}_shape,\n`;
      if (body.includes(`${n}_strides`)) s += `    const __grid_constant__ Strides ${n}_strides,\n`;
      if (body.includes(`${n}_ndim`)) s += `    const __grid_constant__ int ${n}_ndim,\n`;
    }
  });
  s += spec.output_names.map((n, i) => `    ${cudaType(outDtypes[i]!)}* ${n}`).join(",\n");
  s += ") {\n";
  for (const [n, v] of template) {
    s +=
      typeof v === "number"
        ? `  constexpr int ${n} = ${v};\n`
        : typeof v === "boolean"
          ? `  constexpr bool ${n} = ${v};\n`
          : `  using ${n} = ${cudaType(v)};\n`;
  }
  if (template.length) s += "\n";
  s += `${body}\n}\n\n} // namespace mlx::core::cu\n`;
  return [name, s];
}

const { symbols: nv } = dlopen(libPath, {
  nvrtcCreateProgram: { args: [FFIType.ptr, FFIType.cstring, FFIType.cstring, FFIType.i32, FFIType.ptr, FFIType.ptr], returns: FFIType.i32 },
  nvrtcAddNameExpression: { args: [FFIType.ptr, FFIType.cstring], returns: FFIType.i32 },
  nvrtcCompileProgram: { args: [FFIType.ptr, FFIType.i32, FFIType.ptr], returns: FFIType.i32 },
  nvrtcGetProgramLogSize: { args: [FFIType.ptr, FFIType.ptr], returns: FFIType.i32 },
  nvrtcGetProgramLog: { args: [FFIType.ptr, FFIType.ptr], returns: FFIType.i32 },
  nvrtcGetLoweredName: { args: [FFIType.ptr, FFIType.cstring, FFIType.ptr], returns: FFIType.i32 },
  nvrtcDestroyProgram: { args: [FFIType.ptr], returns: FFIType.i32 },
});
const cstr = (s: string) => Buffer.from(`${s}\0`);

/** NVRTC on `source` with MLX's options (compute_90a: PTX, as no sm_90 device is here); null or the log. */
function compile(name: string, source: string): string | null {
  const prog = new BigUint64Array(1);
  const src = cstr(source);
  if (nv.nvrtcCreateProgram(ptr(prog), ptr(src), ptr(cstr(`${name}.cu`)), 0, null, null)) return "nvrtcCreateProgram failed";
  const p = Number(prog[0]) as Pointer;
  const expr = `mlx::core::cu::${name}`;
  nv.nvrtcAddNameExpression(p, ptr(cstr(expr)));
  const opts = [
    "--device-as-default-execution-space",
    "--gpu-architecture=compute_90a",
    ...["cuda_runtime", "cuda_cccl"].map((d) => `--include-path=${join(NV, d, "include")}`),
  ].map(cstr);
  const table = new BigUint64Array(opts.map((o) => BigInt(ptr(o))));
  let err: string | null = null;
  if (nv.nvrtcCompileProgram(p, opts.length, ptr(table))) {
    const n = new BigUint64Array(1);
    nv.nvrtcGetProgramLogSize(p, ptr(n));
    const log = Buffer.alloc(Number(n[0]));
    nv.nvrtcGetProgramLog(p, ptr(log));
    err = log.toString("utf8").slice(0, 3000);
  } else {
    const lowered = new BigUint64Array(1);
    if (nv.nvrtcGetLoweredName(p, ptr(cstr(expr)), ptr(lowered)) || lowered[0] === 0n) err = "no lowered name";
  }
  nv.nvrtcDestroyProgram(ptr(prog));
  return err;
}

// The 12B-shaped step's launches (CPU arrays: only shapes and dtypes are read).
const arr = (shape: number[], dtype: Dtype) => zeros(shape, dtype);
const cases: [string, CustomKernel, MlxArray[]][] = [];
for (const [n, k, bits] of [
  [8192, 3840, 4],
  [3840, 4096, 4],
  [30720, 3840, 4],
  [3840, 15360, 4],
  [262144, 3840, 4],
  [3840, 15360, 8],
] as const) {
  const words = (k * bits) / 32;
  cases.push([
    `qmv_exact ${n}x${k} ${bits}-bit`,
    qmv_exact_kernel,
    [arr([1, 1, k], "bfloat16"), arr([n, words], "uint32"), arr([n, k / 64], "bfloat16"), arr([n, k / 64], "bfloat16")],
  ]);
}
cases.push([
  "residual_norm_exact 3840",
  residual_norm_kernel({ eps: 1e-6, scaled: false, next: true }),
  [arr([1, 1, 3840], "bfloat16"), arr([1, 1, 3840], "bfloat16"), arr([3840], "bfloat16"), arr([3840], "bfloat16"), arr([3840], "bfloat16")],
]);
cases.push([
  "residual_norm_exact 3840, scaled, last",
  residual_norm_kernel({ eps: 1e-6, scaled: true, next: false }),
  [arr([1, 1, 3840], "bfloat16"), arr([1, 1, 3840], "bfloat16"), arr([3840], "bfloat16"), arr([3840], "bfloat16"), arr([1], "bfloat16")],
]);

let bad = 0;
for (const [label, k, inputs] of cases) {
  let problem: string | null;
  try {
    const l = k.spec.launch(inputs);
    const [name, source] = mlxSource(k, inputs, l.template ?? [], l.output_dtypes);
    const direct = source.replace(UTILS, PRELUDE);
    problem = direct.includes('#include "mlx/') ? "includes MLX JIT headers (runs MLX's path)" : compile(name, direct);
  } catch (e) {
    problem = String(e);
  }
  bad += problem ? 1 : 0;
  console.log(`${label}: ${problem ? `FAIL\n${problem}` : "compiles"}`);
  for (const a of inputs) a.dispose();
}
console.log(bad ? `FAIL (${bad})` : "PASS");
process.exit(bad ? 1 : 0);
