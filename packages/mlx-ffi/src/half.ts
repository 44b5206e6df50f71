// float32 <-> bfloat16 / float16 bit conversions (round to nearest even, NaN and Inf kept).

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** bfloat16 bits of a number (rounded to nearest even; NaN stays a quiet NaN). */
export function toBfloat16Bits(x: number): number {
  f32[0] = x;
  const bits = u32[0]!;
  if ((bits & 0x7f800000) === 0x7f800000 && (bits & 0x007fffff) !== 0) return ((bits >>> 16) | 0x0040) & 0xffff;
  const rounded = bits + 0x7fff + ((bits >>> 16) & 1);
  return (rounded >>> 16) & 0xffff;
}

/** The number a bfloat16 bit pattern holds. */
export function fromBfloat16Bits(h: number): number {
  u32[0] = (h & 0xffff) << 16;
  return f32[0]!;
}

/** IEEE float16 bits of a number (rounded to nearest even, overflow to Inf, NaN kept). */
export function toFloat16Bits(x: number): number {
  f32[0] = x;
  const bits = u32[0]!;
  const sign = (bits >>> 16) & 0x8000;
  const exp = (bits >>> 23) & 0xff;
  let mant = bits & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 | (mant >>> 13) : 0);
  let e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    mant |= 0x800000;
    const shift = 14 - e;
    let half = mant >>> shift;
    const rem = mant & ((1 << shift) - 1);
    const mid = 1 << (shift - 1);
    if (rem > mid || (rem === mid && half & 1)) half++;
    return sign | half;
  }
  let half = (e << 10) | (mant >>> 13);
  const rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && half & 1)) half++;
  return sign | half; // a carry into the exponent is the correct rounding (up to Inf)
}

/** The number a float16 bit pattern holds. */
export function fromFloat16Bits(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >>> 10) & 0x1f;
  const mant = h & 0x3ff;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 0x1f) return mant ? Number.NaN : sign * Number.POSITIVE_INFINITY;
  return sign * (1 + mant / 1024) * 2 ** (exp - 15);
}
