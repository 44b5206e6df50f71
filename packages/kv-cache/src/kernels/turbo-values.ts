// TurboQuant value decode as one kernel: unpack the bit-packed codes, look up the Lloyd-Max
// centroid, scale by the row's RMS — the rotated values attention multiplies with. The
// composition materializes the uint8 codes and a float32 copy of every value; the kernel reads
// the packed bytes once and writes the values once.
import { type MlxArray, type Stream } from "@mlx-bun/mlx-ffi";
import * as mx from "@mlx-bun/mlx-ops";

const tq = mx.turboquant;

// Codes are a little-endian bit stream per row (mlx-ops pack_bits): code d occupies bits
// [d·BITS, (d+1)·BITS); a 3-bit code can straddle two bytes. Both sources compute
// centroid × scale in float32 and round once, exactly as the reference (float32 centroids
// times the scale, then astype).
const BODY = `
  long long rows = 1;
  for (int i = 0; i < packed_ndim - 1; ++i) rows *= packed_shape[i];
  if (elem >= rows * DIM) return;
  long long row = elem / DIM;
  int d = (int)(elem % DIM);
  int nbytes = packed_shape[packed_ndim - 1];
  int bit = d * BITS;
  int byte = bit >> 3;
  int shift = bit & 7;
  unsigned int v = (unsigned int)packed[row * nbytes + byte];
  if (shift + BITS > 8) v |= ((unsigned int)packed[row * nbytes + byte + 1]) << 8;
  int code = (int)((v >> shift) & ((1u << BITS) - 1u));
  out[elem] = static_cast<T>(static_cast<float>(centroids[code]) * static_cast<float>(scale[row]));
`;

export const turboValuesKernel = mx.kernels.custom_kernel({
  name: "mlxb_turbo_values",
  input_names: ["packed", "scale", "centroids"],
  output_names: ["out"],
  metal: { source: `  long long elem = (long long)thread_position_in_grid.x;\n${BODY}` },
  cuda: { source: `  long long elem = (long long)cooperative_groups::this_grid().thread_rank();\n${BODY}` },
  validate: ([packed, scale, centroids]) => {
    if (packed!.dtype !== "uint8") return `packed codes must be uint8, got ${packed!.dtype}`;
    if (centroids!.dtype !== "float32" || centroids!.ndim !== 1) return "centroids must be a float32 vector";
    const bits = Math.log2(centroids!.size);
    if (!Number.isInteger(bits) || bits < 1 || bits > 8) return `centroids must have 2^bits entries, got ${centroids!.size}`;
    const lead = packed!.shape.slice(0, -1);
    if (scale!.shape.join() !== [...lead, 1].join()) return `scale ${scale!.describe()} must be [${[...lead, 1].join(", ")}]`;
    return null;
  },
  reference: ([packed, scale, centroids], s) => {
    const bits = Math.log2(centroids!.size);
    const dim = (packed!.shape.at(-1)! * 8) / bits;
    using codes = tq.unpack_bits(packed!, bits, dim, s);
    using unit = tq.codebook_dequantize(codes, centroids!, s);
    using scaled = mx.multiply(unit, scale!, s);
    return [mx.astype(scaled, scale!.dtype, s)];
  },
  launch: ([packed, scale, centroids]) => {
    const bits = Math.log2(centroids!.size);
    const dim = (packed!.shape.at(-1)! * 8) / bits;
    const shape = [...packed!.shape.slice(0, -1), dim];
    return {
      output_shapes: [shape],
      output_dtypes: [scale!.dtype],
      grid: [shape.reduce((a, b) => a * b, 1), 1, 1],
      threadgroup: [256, 1, 1],
      template: [
        ["T", scale!.dtype],
        ["BITS", bits],
        ["DIM", dim],
      ],
    };
  },
});

/** The rotated values [..., D] of TurboQuant value planes (fused on Metal/CUDA, the composition elsewhere). */
export function turboValues(packed: MlxArray, scale: MlxArray, centroids: MlxArray, s?: Stream): MlxArray {
  return turboValuesKernel.run([packed, scale, centroids], s ? { stream: s } : {})[0]!;
}
