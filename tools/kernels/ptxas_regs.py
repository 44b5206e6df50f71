"""Registers per thread of the decode-attention kernels and the quantized matvec, without a GPU.

Usage: python ptxas_regs.py kernel-sources.json [--setup]
  (kernel-sources.json from tools/kernels/export-sources.ts; --setup first downloads NVRTC, the
  CUDA headers, libcu++ and ptxas 12.9 as PyPI wheels into .native/cuda-ptxas)

Each pass-1 body is compiled as MLX's cuda_kernel wraps it (check_cuda_kernels.py's kernel_params,
as its emulator does: arrays, their shapes and strides, template constants) with
NVRTC to PTX, then by ptxas for sm_90, whose `-v` report gives the registers a thread takes. A
threadgroup of 128 threads at R registers fits floor(65536 / (128 · R)) times on an H100/H200 SM:
168 registers allow 3, 198 only 2 (issue 24: the first reduce-scatter cut of the tile's softmax
took 198 and ran slower for it). On the H200 these counts matched Nsight Compute's (168, 167,
198, 166 for the four variants measured on 2026-12-04). Not MLX's NVRTC 13 build: a count may
move by a few registers there.
"""
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import zipfile

from check_cuda_kernels import kernel_params  # the signature MLX's cuda_kernel generates

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DIR = os.path.join(ROOT, ".native", "cuda-ptxas")
WHEELS = ["nvidia-cuda-nvrtc-cu12==12.9.86", "nvidia-cuda-nvcc-cu12==12.9.86", "nvidia-cuda-runtime-cu12==12.9.79",
          "nvidia-cuda-cccl-cu12==12.9.27"]
NV = os.path.join(DIR, "nvidia")

# The variants the bench models run: (kernel, template constants).
TURBO = dict(BK=4, GK=32, VB=3)
VARIANTS = [
    ("mlxb_turbo_decode_partials", dict(DK=512, DV=512, NREP=2, REPS=2, NT=4, **TURBO)),
    ("mlxb_turbo_decode_partials", dict(DK=256, DV=256, NREP=4, REPS=4, NT=4, **TURBO)),
    # Two query heads a warp (MLX_BUN_DECODE_LANE_FLOATS=16): 122 registers, 4 threadgroups an SM.
    ("mlxb_turbo_decode_partials", dict(DK=256, DV=256, NREP=4, REPS=2, NT=4, **TURBO)),
    ("mlxb_affine_decode_partials", dict(DK=512, DV=512, NREP=2, REPS=2, NT=2, BK=8, GK=64, BV=8, GV=64)),
    ("mlxb_affine_decode_partials", dict(DK=256, DV=256, NREP=4, REPS=4, NT=4, BK=4, GK=64, BV=4, GV=64)),
    # The 12B-shaped model's FFN up projection at one and four rows (issue 20).
    ("mlxb_qmv", dict(BITS=4, GS=64, K=3840, N=15360, MB=1, RPW=4, SPLIT=4)),
    ("mlxb_qmv", dict(BITS=4, GS=64, K=3840, N=15360, MB=4, RPW=4, SPLIT=4)),
    # MLX's own arithmetic with wider loads (qmv-exact.ts): the 12B's up and down projections, one
    # row and seven, 4-bit and 8-bit, 4 chunks in flight (the default), and 2 and 8 at one row.
    ("mlxb_qmv_exact", dict(K=3840, GS=64, R=1, BITS=4, CH=4, XS=0, RPW=1, GLU=0)),
    ("mlxb_qmv_exact", dict(K=15360, GS=64, R=1, BITS=4, CH=4, XS=0, RPW=1, GLU=0)),
    ("mlxb_qmv_exact", dict(K=3840, GS=64, R=7, BITS=4, CH=4, XS=0, RPW=1, GLU=0)),
    ("mlxb_qmv_exact", dict(K=3840, GS=64, R=1, BITS=8, CH=4, XS=0, RPW=1, GLU=0)),
    ("mlxb_qmv_exact", dict(K=15360, GS=64, R=1, BITS=8, CH=4, XS=0, RPW=1, GLU=0)),
    ("mlxb_qmv_exact", dict(K=3840, GS=64, R=7, BITS=8, CH=4, XS=0, RPW=1, GLU=0)),
    ("mlxb_qmv_exact", dict(K=3840, GS=64, R=1, BITS=4, CH=2, XS=0, RPW=1, GLU=0)),
    ("mlxb_qmv_exact", dict(K=3840, GS=64, R=1, BITS=4, CH=8, XS=0, RPW=1, GLU=0)),
    ("mlxb_qmv_exact", dict(K=15360, GS=64, R=1, BITS=4, CH=8, XS=0, RPW=1, GLU=0)),
    # The staged launch (x in shared memory, RPW rows a warp, loads issued across rows): the 12B's
    # gate/up stack (RPW 8), down (1), q/k/v (2) and lm_head (8), 4 and 8 chunks.
    ("mlxb_qmv_exact", dict(K=3840, GS=64, R=1, BITS=4, CH=4, XS=1, RPW=8, GLU=0)),
    ("mlxb_qmv_exact", dict(K=3840, GS=64, R=1, BITS=4, CH=8, XS=1, RPW=8, GLU=0)),
    ("mlxb_qmv_exact", dict(K=15360, GS=64, R=1, BITS=4, CH=4, XS=1, RPW=1, GLU=0)),
    ("mlxb_qmv_exact", dict(K=15360, GS=64, R=1, BITS=4, CH=8, XS=1, RPW=1, GLU=0)),
    ("mlxb_qmv_exact", dict(K=3840, GS=64, R=1, BITS=4, CH=4, XS=1, RPW=2, GLU=0)),
    ("mlxb_qmv_exact", dict(K=3840, GS=64, R=1, BITS=8, CH=4, XS=1, RPW=4, GLU=0)),
    # The gate/up stack with its GeGLU (two rows a warp): the 12B's (K 3,840) and the 1B's (1,536).
    ("mlxb_qmv_exact_geglu", dict(K=3840, GS=64, R=1, BITS=4, CH=4, XS=0, RPW=1, GLU=1)),
    ("mlxb_qmv_exact_geglu", dict(K=1536, GS=64, R=1, BITS=4, CH=4, XS=0, RPW=1, GLU=1)),
    # Decode attention at MLX's rounding points (sdpa-decode.ts): the 12B's sliding (8 KV heads of
    # 256, 2 query heads each) and full (1 KV head of 512, 16 query heads) layers.
    ("mlxb_sdpa_decode_scores", dict(D=256, REP=2, WARPS=8, TOK=32, MAXK=1024)),
    ("mlxb_sdpa_decode_scores", dict(D=512, REP=16, WARPS=8, TOK=32, MAXK=1024)),
    ("mlxb_sdpa_decode_values", dict(DV=256, REP=2, WARPS=8, CHUNK=64)),
    ("mlxb_sdpa_decode_values", dict(DV=512, REP=16, WARPS=8, CHUNK=64)),
]
TYPES = {"kw": "uint32_t", "vw": "uint32_t", "w": "uint32_t", "vc": "uint8_t", "centroids": "float", "mask": "bool"}
OUT_TYPES = {"out": "T", "s": "T", "o": "T"}


def setup():
    os.makedirs(DIR, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", DIR, *WHEELS], check=True)
    for w in os.listdir(DIR):
        if w.endswith(".whl"):
            with zipfile.ZipFile(os.path.join(DIR, w)) as z:
                z.extractall(DIR)
    os.chmod(os.path.join(NV, "cuda_nvcc", "bin", "ptxas"), 0o755)


def registers(spec, consts):
    src = spec["cuda"]["source"]
    params = kernel_params(spec, [TYPES.get(n, "T") for n in spec["input_names"]], [OUT_TYPES.get(n, "float") for n in spec["output_names"]])
    body = "".join(f"  constexpr int {k} = {v};\n" for k, v in consts.items())
    code = f"""#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda/std/array>
#include <cuda/std/cstdint>
#include <cuda/std/limits>
using Shape = cuda::std::array<int32_t, 10>;
using Strides = cuda::std::array<int64_t, 10>;
using T = __nv_bfloat16;
{spec["cuda"].get("header") or ""}
extern "C" __global__ void kernel({", ".join(params)}) {{
{body}{src}
}}
"""
    nvrtc = ctypes.CDLL(os.path.join(NV, "cuda_nvrtc", "lib", "libnvrtc.so.12"))
    prog = ctypes.c_void_p()
    if nvrtc.nvrtcCreateProgram(ctypes.byref(prog), code.encode(), b"kernel.cu", 0, None, None):
        raise RuntimeError("nvrtcCreateProgram failed")
    # MLX's JIT headers are not files here: tools/kernels/mlx/… stands in for the functors a body includes.
    opts = [b"-arch=compute_90", b"-std=c++17", f"-I{os.path.dirname(os.path.abspath(__file__))}".encode()]
    opts += [f"-I{os.path.join(NV, d, 'include')}".encode() for d in ("cuda_runtime", "cuda_cccl", "cuda_nvrtc")]
    rc = nvrtc.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    n = ctypes.c_size_t()
    if rc:
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value)
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise RuntimeError(f"NVRTC failed for {spec['name']}:\n{log.value.decode()[-3000:]}")
    nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(n))
    ptx = ctypes.create_string_buffer(n.value)
    nvrtc.nvrtcGetPTX(prog, ptx)
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "k.ptx"), "wb") as f:
            f.write(ptx.value)
        r = subprocess.run([os.path.join(NV, "cuda_nvcc", "bin", "ptxas"), "-arch=sm_90", "-v", os.path.join(d, "k.ptx"), "-o",
                            os.path.join(d, "k.cubin")], capture_output=True, text=True, check=True)
    line = next(l for l in r.stderr.splitlines() if "registers" in l)
    spills = next((l.strip() for l in r.stderr.splitlines() if "spill" in l), "")
    if "0 bytes spill stores" not in spills or not spills.startswith("0 bytes stack"):
        print(f"  ptxas: {spills}")  # local memory: the register arrays did not stay in registers
    return int(line.split("Used ")[1].split(" registers")[0])


def main():
    args = sys.argv[1:]
    if "--setup" in args or not os.path.exists(os.path.join(NV, "cuda_nvcc", "bin", "ptxas")):
        setup()
    specs = json.load(open(next(a for a in args if not a.startswith("--"))))
    specs = {s["name"]: s for s in (specs if isinstance(specs, list) else specs.values())}
    for name, consts in VARIANTS:
        regs = registers(specs[name], dict(consts, MASK_MODE=0) if "decode" in name else consts)
        print(f"{name} {' '.join(f'{k}={v}' for k, v in consts.items())}: {regs} registers, "
              f"{65536 // (128 * ((regs + 7) // 8 * 8))} threadgroups of 128 per SM")


if __name__ == "__main__":
    main()
