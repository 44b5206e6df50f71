// Kernel source text shared by the fused decode-attention kernels (affine and TurboQuant):
// the pass-1 body (online softmax over one warp's run of tokens, partials out) with the key
// and value decoding spliced in, and the per-backend spellings of the few intrinsics used.
// Layout and numerics: docs/kv-cache-kernels.md.

export type Backend = "metal" | "cuda";

/** Warps (simdgroups) per threadgroup of pass 1; their runs are merged before one partial is written. */
export const WARPS = 4;
/** Warps per threadgroup of pass 2 (each takes every COMBINE_WARPS-th partial). */
export const COMBINE_WARPS = 16;

interface Ops {
  /** Per-warp (CUDA) / per-simdgroup (Metal) index variables. */
  prelude: string;
  /** Storage class of threadgroup (shared) memory, and the threadgroup barrier. */
  shared: string;
  barrier: string;
  exp: string;
  max: string;
  negInf: string;
  /** Lane `lane ^ off`'s float `v`. */
  shuffleXor: (v: string, off: string) => string;
  /** Max / sum of one float across the warp, every lane getting the result. */
  warpMax: (x: string) => string;
  warpSum: (x: string) => string;
  /** Lane `src`'s float `v`, read by every lane (all 32 reach it together: warp-uniform control flow). */
  shuffle: (v: string, src: string) => string;
  /**
   * Put before loops over template constants: fully unrolled, the register arrays they index stay
   * in registers (a loop the compiler leaves rolled indexes them in local memory). Empty on Metal,
   * where it is not yet measured.
   */
  unroll: string;
}

const OPS: Record<Backend, Ops> = {
  // Grid: x = partial · (NREP / REPS) + the group of REPS query heads (one threadgroup of WARPS warps each); y = b·Hkv + h.
  cuda: {
    prelude: `
  const int tid = (int)threadIdx.x;
  const int lane = tid & 31;
  const int wid = tid >> 5;
  const int tgx = (int)blockIdx.x;
  const int NGX = (int)gridDim.x;
  const int bh = (int)blockIdx.y;`,
    shared: "__shared__",
    barrier: "__syncthreads();",
    exp: "expf",
    max: "fmaxf",
    negInf: "(-cuda::std::numeric_limits<float>::infinity())",
    shuffleXor: (v, off) => `__shfl_xor_sync(0xffffffffu, ${v}, ${off})`,
    warpMax: (x) => `for (int off = 16; off > 0; off >>= 1) ${x} = fmaxf(${x}, __shfl_xor_sync(0xffffffffu, ${x}, off));`,
    warpSum: (x) => `for (int off = 16; off > 0; off >>= 1) ${x} += __shfl_xor_sync(0xffffffffu, ${x}, off);`,
    shuffle: (v, src) => `__shfl_sync(0xffffffffu, ${v}, ${src})`,
    unroll: "#pragma unroll",
  },
  // Metal: simdgroups are 32 lanes of consecutive thread indices of a 1-D threadgroup.
  metal: {
    prelude: `
  const int tid = (int)thread_position_in_threadgroup.x;
  const int lane = (int)thread_index_in_simdgroup;
  const int wid = tid >> 5;
  const int tgx = (int)threadgroup_position_in_grid.x;
  const int NGX = (int)threadgroups_per_grid.x;
  const int bh = (int)threadgroup_position_in_grid.y;`,
    shared: "threadgroup",
    barrier: "metal::threadgroup_barrier(metal::mem_flags::mem_threadgroup);",
    exp: "metal::precise::exp",
    max: "metal::fmax",
    negInf: "(-metal::numeric_limits<float>::infinity())",
    shuffleXor: (v, off) => `metal::simd_shuffle_xor(${v}, (ushort)(${off}))`,
    warpMax: (x) => `${x} = metal::simd_max(${x});`,
    warpSum: (x) => `${x} = metal::simd_sum(${x});`,
    shuffle: (v, src) => `metal::simd_shuffle(${v}, (ushort)(${src}))`,
    unroll: "",
  },
};

/** Where a decoder's loop over a template-constant count goes; partialsSource puts the backend's unroll hint there. */
export const UNROLL = "/*@unroll*/";

/** -FLT_MAX: the score of a key a boolean mask hides (finite, so a fully hidden row is uniform, as in the reference). */
const HIDDEN = "-3.4028234663852886e38f";

/**
 * How a kernel reads one of K or V. Per tile, `load` runs for every slot `j` (token `t`) before
 * any `decode`, so a tile's loads are all in flight at once, and it keeps only the raw words
 * (`regs`, arrays over the NT slots); `decode` then turns slot `j` into the lane's floats
 * `out[0..n)` just before they are used. The raw words are a few registers per token where the
 * decoded floats are n: a tile holds several times more tokens in flight in the same registers.
 * `prelude` runs once per lane before the token loop. The registers a lane holds per slot
 * (affineTokenRegs, TURBO_VALUE_TOKEN_REGS) size the tile (decodePlan).
 *
 * `fast` (CUDA): the same raw words through lane pointers set once (`fast.prelude`), 32-bit row
 * offsets and vector loads, where `load` computes a 64-bit offset through four strides per plane
 * and token (the H200 profile: two thirds of pass 1's instructions were such address arithmetic
 * and byte loads). The kernel takes it when every decoder's `fast.ok` holds: a warp-uniform test
 * of the planes' strides and alignment that the caches' planes (slices along T of row-major
 * buffers) pass; any other layout takes `load`.
 */
export interface Decoder {
  prelude: string;
  regs: string;
  load: string;
  fast?: { prelude: string; ok: string; load: string };
  decode: string;
  /**
   * CUDA, keys: score slot j straight from the raw words (`code` sets sc[j][r] for every query head)
   * where the constexpr `when` holds, instead of decoding `kf` and dotting it; `prelude` runs once
   * the queries are loaded (and may rescale them: they are used for nothing else).
   */
  score?: { when: string; prelude: string; code: string };
}

/** A test that row offsets of plane `a` up to its last token fit 32 bits (so a lane pointer plus `t · stride` is exact). */
const rows32 = (a: string): string => `(${a}_strides[2] >= 0 && (int64_t)${a}_shape[2] * ${a}_strides[2] + ${a}_shape[3] < 2147483647LL)`;

/**
 * Affine decode of plane `p` (`${p}w` packed uint32, `${p}s` scales, `${p}b` biases) for lane
 * `lane`: element e of a row is bits [e·BITS mod 32, +BITS) of uint32 word e·BITS/32 (BITS ∈
 * {2, 4, 8}: a code never straddles words), dequantized as code · scale + bias of group e / GROUP
 * (mx.dequantize's formula). The lane's N·BITS bits span NW words; its elements one group (N
 * divides GROUP: N a power of two) or two.
 */
export function affineDecoder(backend: Backend, p: string, out: string, n: string, bits: string, group: string): Decoder {
  const [w, s, bias] = [`${p}w`, `${p}s`, `${p}b`];
  const prelude = `
  constexpr int ${p}_LB = ${n} * ${bits};
  // Words a lane's bits start in: whole words (LB a multiple of 32), within one word (LB divides 32), else any offset.
  constexpr bool ${p}_ALIGNED = (${p}_LB % 32) == 0 || (32 % ${p}_LB) == 0;
  constexpr int ${p}_NW = (${p}_LB % 32) == 0 ? ${p}_LB / 32 : ((32 % ${p}_LB) == 0 ? 1 : ${p}_LB / 32 + 2);
  constexpr int ${p}_NG = (${group} % ${n}) == 0 ? 1 : 2;
  const int ${p}_word0 = (lane * ${p}_LB) >> 5;
  const int ${p}_off0 = (${p}_LB % 32) == 0 ? 0 : ((lane * ${p}_LB) & 31);
  const int ${p}_g0 = (lane * ${n}) / ${group};`;
  const regs = `
    uint32_t ${p}_raw[NT][${p}_NW];
    float ${p}_sc[NT][${p}_NG];
    float ${p}_bi[NT][${p}_NG];`;
  const load = `
      {
        const int64_t wr = b * ${w}_strides[0] + h * ${w}_strides[1] + t * ${w}_strides[2];
        const int64_t sr = b * ${s}_strides[0] + h * ${s}_strides[1] + t * ${s}_strides[2];
        const int64_t br = b * ${bias}_strides[0] + h * ${bias}_strides[1] + t * ${bias}_strides[2];
        ${UNROLL}
        for (int k = 0; k < ${p}_NW; ++k) {
          const int wd = ${p}_word0 + k;
          ${p}_raw[j][k] = (${p}_ALIGNED || wd < ${w}_shape[3]) ? ${w}[wr + wd * ${w}_strides[3]] : 0u;
        }
        ${UNROLL}
        for (int g = 0; g < ${p}_NG; ++g) {
          const int gg = (${p}_g0 + g < ${s}_shape[3]) ? ${p}_g0 + g : ${p}_g0;
          ${p}_sc[j][g] = static_cast<float>(${s}[sr + gg * ${s}_strides[3]]);
          ${p}_bi[j][g] = static_cast<float>(${bias}[br + gg * ${bias}_strides[3]]);
        }
      }`;
  const decode = `
      ${UNROLL}
      for (int i = 0; i < ${n}; ++i) {
        const int bit = ${p}_off0 + i * ${bits};
        const uint32_t code = (${p}_raw[j][${p}_NW == 1 ? 0 : (bit >> 5)] >> (bit & 31)) & ((1u << ${bits}) - 1u);
        const int g = ${p}_NG == 1 ? 0 : (lane * ${n} + i) / ${group} - ${p}_g0;
        ${out}[i] = static_cast<float>(code) * ${p}_sc[j][g] + ${p}_bi[j][g];
      }`;
  if (backend !== "cuda") return { prelude, regs, load, decode };
  // Scores from the codes: q·k = s·Σ q_i·c_i + b·Σ q_i over the lane's one group. Code c_i, at
  // bit p of its word (of the word >> 16 when p ≥ 16), becomes the float c_i·2^(p mod 16) with one
  // logical op and one exact subtraction (2^23 + c·2^q − 2^23); the queries carry the 2^−q (exact).
  // Per element that is two instructions where shift, mask, int-to-float and dequantize were four.
  const when = `${p}_ALIGNED && ${p}_NG == 1`;
  const score = {
    when,
    prelude: `
  float ${p}_qsum[REPS];
  if constexpr (${when}) {
    ${UNROLL}
    for (int r = 0; r < REPS; ++r) {
      float acc = 0.0f;
      ${UNROLL}
      for (int i = 0; i < ${n}; ++i) acc += qv[r][i];
      ${p}_qsum[r] = acc;
      ${UNROLL}
      for (int i = 0; i < ${n}; ++i) qv[r][i] *= 1.0f / (float)(1 << ((i * ${bits}) & 15));
    }
  }`,
    code: `
        float dot[REPS];
        ${UNROLL}
        for (int r = 0; r < REPS; ++r) dot[r] = 0.0f;
        ${UNROLL}
        for (int i = 0; i < ${n}; ++i) {
          const int bit = i * ${bits};
          const uint32_t wd = (${p}_LB % 32 == 0) ? ${p}_raw[j][${p}_NW == 1 ? 0 : (bit >> 5)] : (${p}_raw[j][0] >> ${p}_off0);
          const uint32_t src = (bit & 31) < 16 ? wd : (wd >> 16);
          const float c = __uint_as_float(0x4B000000u | (src & (((1u << ${bits}) - 1u) << (bit & 15)))) - 8388608.0f;
          ${UNROLL}
          for (int r = 0; r < REPS; ++r) dot[r] += qv[r][i] * c;
        }
        ${UNROLL}
        for (int r = 0; r < REPS; ++r) sc[j][r] = dot[r] * ${p}_sc[j][0] + ${p}_bi[j][0] * ${p}_qsum[r];`,
  };
  // The lane's NW words as one vector load where they are 1, 2 or 4 aligned words of one group.
  const fast = {
    prelude: `
  constexpr int ${p}_VW = (${p}_ALIGNED && ${p}_NG == 1 && (${p}_NW == 1 || ${p}_NW == 2 || ${p}_NW == 4)) ? ${p}_NW : 0;
  const uint32_t* ${p}_wl = ${w} + (b * ${w}_strides[0] + h * ${w}_strides[1] + ${p}_word0);
  const auto* ${p}_sl = ${s} + (b * ${s}_strides[0] + h * ${s}_strides[1] + ${p}_g0);
  const auto* ${p}_bl = ${bias} + (b * ${bias}_strides[0] + h * ${bias}_strides[1] + ${p}_g0);
  const int ${p}_wrs = (int)${w}_strides[2];
  const int ${p}_srs = (int)${s}_strides[2];
  const int ${p}_brs = (int)${bias}_strides[2];`,
    ok: `(${p}_VW > 0 && ${w}_strides[3] == 1 && (${s}_shape[3] == 1 || ${s}_strides[3] == 1) && (${bias}_shape[3] == 1 || ${bias}_strides[3] == 1) &&
        (reinterpret_cast<uintptr_t>(${p}_wl) % (4 * (${p}_VW > 0 ? ${p}_VW : 1))) == 0 && ${p}_wrs % (${p}_VW > 0 ? ${p}_VW : 1) == 0 &&
        ${rows32(w)} && ${rows32(s)} && ${rows32(bias)})`,
    load: `
      {
        const uint32_t* wp = ${p}_wl + t * ${p}_wrs;
        if constexpr (${p}_VW == 4) {
          const uint4 x = *reinterpret_cast<const uint4*>(wp);
          ${p}_raw[j][0] = x.x;
          ${p}_raw[j][${p}_NW > 1 ? 1 : 0] = x.y;
          ${p}_raw[j][${p}_NW > 2 ? 2 : 0] = x.z;
          ${p}_raw[j][${p}_NW > 3 ? 3 : 0] = x.w;
        } else if constexpr (${p}_VW == 2) {
          const uint2 x = *reinterpret_cast<const uint2*>(wp);
          ${p}_raw[j][0] = x.x;
          ${p}_raw[j][${p}_NW > 1 ? 1 : 0] = x.y;
        } else if constexpr (${p}_VW == 1) {
          ${p}_raw[j][0] = *wp;
        }
        ${p}_sc[j][0] = static_cast<float>(${p}_sl[t * ${p}_srs]);
        ${p}_bi[j][0] = static_cast<float>(${p}_bl[t * ${p}_brs]);
      }`,
  };
  return { prelude, regs, load, fast, decode, score };
}

/** 32-bit registers affineDecoder holds per token for `dim` elements of `bits` bits in groups of `group`. */
export function affineTokenRegs(dim: number, bits: number, group: number): number {
  const lb = (dim / 32) * bits;
  const words = lb % 32 === 0 ? lb / 32 : 32 % lb === 0 ? 1 : Math.floor(lb / 32) + 2;
  return words + 2 * (group % (dim / 32) === 0 ? 1 : 2);
}

/**
 * TurboQuant value decode (the rotated value, as turbo_values): code d is bits [d·VB, +VB) of
 * the row's little-endian byte stream; value = centroid · scale rounded to T, exactly the
 * reference's rounding. Lane c holds centroid c mod NC, so per token every lane rounds its
 * centroid × row scale once and an element's value is a shuffle from lane `code`; the lane's
 * EV codes come from one read of the bytes spanning its EV·VB bits into a uint64_t (byte loads,
 * a dependent centroid load and a rounding per element had made the kernel issue-bound on the
 * H200).
 */
export function turboValueDecoder(backend: Backend, out: string): Decoder {
  const prelude = `
  constexpr int NC = 1 << VB;
  constexpr int VBITS = EV * VB;
  // A lane's codes start at bit lane·VBITS; the worst start within a byte over the lanes is
  // 8 − (largest power of two ≤ 8 dividing VBITS), so VSPAN bits cover any lane's bytes.
  constexpr int VLOW = VBITS & -VBITS;
  constexpr int VSPAN = VBITS + (VLOW >= 8 ? 0 : 8 - VLOW);
  // Every head dim up to 512 (EV ≤ 16) at 2-4 bits fits one uint64_t.
  static_assert(VSPAN <= 64, "a lane's value codes must fit one 64-bit word");
  constexpr int VNB = (VSPAN + 7) / 8;
  const float cent = centroids[lane & (NC - 1)];
  const int vBit0 = lane * VBITS;
  const int vByte0 = vBit0 >> 3;
  const int vEnd = (vBit0 + VBITS + 7) >> 3;`;
  const regs = `
    uint64_t v_raw[NT];
    float v_rs[NT];`;
  const load = `
      {
        const int64_t cr = b * vc_strides[0] + h * vc_strides[1] + t * vc_strides[2];
        v_rs[j] = static_cast<float>(vs[b * vs_strides[0] + h * vs_strides[1] + t * vs_strides[2]]);
        uint64_t vbits = 0;
        ${UNROLL}
        for (int k = 0; k < VNB; ++k) {
          // A lane needs VNB - 1 or VNB bytes: only the last may lie past its span (and the row).
          if (k + 1 < VNB || vByte0 + k < vEnd) vbits |= (uint64_t)vc[cr + (vByte0 + k) * vc_strides[3]] << (8 * k);
        }
        v_raw[j] = vbits >> (vBit0 & 7);
      }`;
  // CUDA's shuffle reads only the low 5 bits of its source lane, and lane c holds centroid c mod NC:
  // the code needs no mask there.
  const codeMask = backend === "cuda" ? "" : " & (NC - 1)";
  const decode = `
      {
        // The same float32 product and rounding to T as the reference, once per lane and token.
        const float tv = static_cast<float>(static_cast<T>(cent * v_rs[j]));
        ${UNROLL}
        for (int i = 0; i < EV; ++i) {
          const int code = (int)((uint32_t)(v_raw[j] >> (i * VB))${codeMask});
          ${out}[i] = ${OPS[backend].shuffle("tv", "code")};
        }
      }`;
  if (backend !== "cuda") return { prelude, regs, load, decode };
  // The lane's codes as one or two aligned 32-bit words: a row's DV·VB/8 bytes are whole words.
  const fast = {
    prelude: `
  // A lane's codes start at bit lane·VBITS: at most 32 − gcd(VBITS, 32) bits into a word.
  constexpr int VOFF = (VLOW >= 32) ? 0 : 32 - VLOW;
  constexpr int VNW = (VBITS + VOFF + 31) / 32;
  const int vRowW = vc_shape[3] >> 2;
  const int vW0 = vBit0 >> 5;
  // The last lane's second word may lie past the row: it re-reads the row's last (bits unused).
  const int vW1 = (vW0 + 1 < vRowW) ? vW0 + 1 : vRowW - 1;
  const uint32_t* vcl = reinterpret_cast<const uint32_t*>(vc + (b * vc_strides[0] + h * vc_strides[1]));
  const auto* vsl = vs + (b * vs_strides[0] + h * vs_strides[1]);
  const int vcrs = (int)(vc_strides[2] >> 2);
  const int vsrs = (int)vs_strides[2];`,
    ok: `(VNW <= 2 && vc_strides[3] == 1 && (vc_shape[3] & 3) == 0 && (vc_strides[2] & 3) == 0 && (reinterpret_cast<uintptr_t>(vcl) & 3) == 0 &&
        ${rows32("vc")} && ${rows32("vs")})`,
    load: `
      {
        const uint32_t* cp = vcl + t * vcrs;
        const uint32_t w0 = cp[vW0];
        const uint32_t w1 = VNW > 1 ? cp[vW1] : 0u;
        v_raw[j] = ((uint64_t)w1 << 32 | w0) >> (vBit0 & 31);
        v_rs[j] = static_cast<float>(vsl[t * vsrs]);
      }`,
  };
  return { prelude, regs, load, fast, decode };
}
/** 32-bit registers turboValueDecoder holds per token: the 64-bit codes and the row scale. */
export const TURBO_VALUE_TOKEN_REGS = 3;

/**
 * Pass 1. A threadgroup of WARPS warps takes WARPS consecutive runs of tokens for one
 * (b, KV head h, group rg of REPS query heads); warp w takes run `group·WARPS + w`. The run
 * length is the even split over the grid rounded up to whole tiles (decodeRunLength in
 * decode-plan.ts), so the context length is never a template. Lane l holds elements
 * [l·EK, (l+1)·EK) of each query (EK = DK/32) and of each output accumulator (EV = DV/32).
 * Per tile of NT tokens: the raw words of the NT key and value slices are loaded first (their
 * loads all in flight), then each slot's keys are decoded into the NT·REPS dot products, reduced
 * across the warp together, the mask, one online-softmax update per query head over the tile
 * (running max m, sum l, unnormalized output o, float32), and each slot's values are decoded into
 * the accumulators. Then the warps' (m, l, o) are merged in threadgroup memory and the
 * threadgroup writes one partial; pass 2 (decode-combine.ts) merges those.
 * Templates: T, DK, DV, NREP (query heads per KV head), REPS, NT, MASK_MODE (0 one boolean
 * for every key, 1 boolean, 2 additive) and the decoders' own. The decoders write `kf` / `vf` (EK / EV floats).
 */
export function partialsSource(backend: Backend, key: Decoder, value: Decoder): string {
  const o = OPS[backend];
  const tiles = (fast: boolean): string => `  for (int tb = t0; tb < t1; tb += NT) {${key.regs}${value.regs}
    float mv[NT];
    ${o.unroll}
    for (int j = 0; j < NT; ++j) {
      // A slot past the run re-reads its last token (in bounds) and is dropped below.
      const int t = (tb + j < t1) ? tb + j : t1 - 1;${fast ? key.fast!.load : key.load}${fast ? value.fast!.load : value.load}
      mv[j] = MASK_MODE == 0 ? mask0 : static_cast<float>(mask[mrow + (int64_t)t * mstride]);
    }
    float sc[NT][REPS];
    ${o.unroll}
    for (int j = 0; j < NT; ++j) {${key.score ? `\n      if constexpr (${key.score.when}) {${key.score.code}\n      } else {` : ""}
      float kf[EK];${key.decode}
      ${o.unroll}
      for (int r = 0; r < REPS; ++r) {
        float acc = 0.0f;
        ${o.unroll}
        for (int i = 0; i < EK; ++i) acc += qv[r][i] * kf[i];
        sc[j][r] = acc;
      }${key.score ? "\n      }" : ""}
    }
    // Reduce-scatter: at each butterfly level a lane keeps half of its sums and sends the other half,
    // so after log2(VP) levels lane L holds the whole sum of one (slot, head) k = L >> SH (the same
    // pairs added in the same order as a full butterfly of every sum: the same bits, in 1/VP of
    // the shuffles). The online-softmax update then runs once per (slot, head) instead of in every
    // lane, and each probability reaches every lane by one shuffle.
    float x[VP];
    ${o.unroll}
    for (int k = 0; k < VP; ++k) x[k] = ((k / RP) < NT && (k % RP) < REPS) ? sc[(k / RP) < NT ? k / RP : 0][(k % RP) < REPS ? k % RP : 0] : 0.0f;
    ${o.unroll}
    for (int lvl = 0; lvl < 5; ++lvl) {
      const int off = 16 >> lvl;
      const bool up = (lane & off) != 0;
      ${o.unroll}
      for (int i = 0; i < ((VP >> lvl) > 1 ? (VP >> lvl) / 2 : 0); ++i) {
        const int hh = (VP >> lvl) / 2;
        const float keep = up ? x[i + hh] : x[i];
        const float send = up ? x[i] : x[i + hh];
        x[i] = keep + ${o.shuffleXor("send", "off")};
      }
      if ((VP >> lvl) <= 1) x[0] += ${o.shuffleXor("x[0]", "off")};
    }
    // This lane's (slot, head): its mask, its bound, then each head's tile max over the slots' lanes.
    float mvo = mv[0];
    ${o.unroll}
    for (int jj = 1; jj < NT; ++jj) mvo = (j_own == jj) ? mv[jj] : mvo;
    float so = x[0];
    if (MASK_MODE != 2) so = (mvo != 0.0f) ? so : ${HIDDEN};
    else so += mvo;
    so = (own_live && tb + j_own < t1) ? so : ${o.negInf};
    float tm = so;
    ${o.unroll}
    for (int bt = SH + LGR; bt < 5; ++bt) tm = ${o.max}(tm, ${o.shuffleXor("tm", "1 << bt")});
    // Each head's new running max, in every lane; rescale (by exp(m − m') = 1 for a head whose max
    // held: the same bits as skipping it) only when one grew. An all −∞ head (an additive mask's
    // prefix) keeps m = −∞ and gets alpha 0 and probabilities 0: nothing, as before.
    float mn[REPS];
    bool grow = false;
    ${o.unroll}
    for (int r = 0; r < REPS; ++r) {
      mn[r] = ${o.max}(m[r], ${o.shuffle("tm", "r << SH")});
      grow = grow || (mn[r] != m[r]);
    }
    if (grow) {
      ${o.unroll}
      for (int r = 0; r < REPS; ++r) {
        const float alpha = (mn[r] == m[r]) ? 1.0f : ((m[r] == ${o.negInf}) ? 0.0f : ${o.exp}(m[r] - mn[r]));
        l[r] *= alpha;
        ${o.unroll}
        for (int i = 0; i < EV; ++i) o[r][i] *= alpha;
        m[r] = mn[r];
      }
    }
    float mo = mn[0];
    ${o.unroll}
    for (int rr = 1; rr < REPS; ++rr) mo = (r_own == rr) ? mn[rr] : mo;
    const float po = (so == ${o.negInf}) ? 0.0f : ${o.exp}(so - mo);
    // Each slot's probabilities exp(s − m) reach every lane just before its values are added; l sums them in slot order.
    ${o.unroll}
    for (int j = 0; j < NT; ++j) {
      float pj[REPS];
      ${o.unroll}
      for (int r = 0; r < REPS; ++r) {
        pj[r] = ${o.shuffle("po", "(j * RP + r) << SH")};
        l[r] += pj[r];
      }
      float vf[EV];${value.decode}
      ${o.unroll}
      for (int r = 0; r < REPS; ++r) {
        ${o.unroll}
        for (int i = 0; i < EV; ++i) o[r][i] += pj[r] * vf[i];
      }
    }
  }`;
  // Both load variants where the decoders have fast loads (CUDA): the warp-uniform test picks one.
  const fastLoops =
    key.fast && value.fast
      ? `${key.fast.prelude}${value.fast.prelude}
  if (${key.fast.ok} && ${value.fast.ok}) {
  ${tiles(true)}
  } else {
  ${tiles(false)}
  }`
      : tiles(false);
  const text = `${o.prelude}
  constexpr int WARPS = ${WARPS};
  constexpr int EK = DK / 32;
  constexpr int EV = DV / 32;
  constexpr int NRG = NREP / REPS;
  const int tg = tgx / NRG;
  const int rg = tgx - tg * NRG;
  const int NG = NGX / NRG;
  const int T_LEN = kw_shape[2];
  const int HKV = kw_shape[1];
  const int RUN = ((T_LEN + NG * WARPS - 1) / (NG * WARPS) + NT - 1) / NT * NT;
  const int b = bh / HKV;
  const int h = bh - b * HKV;
  const int HQ = HKV * NREP;
  // The reduce-scatter's layout (tiles): NT slots × REPS heads padded to powers of two, VP ≤ 32
  // sums; lane L holds sum k = L >> SH of them, slot k / RP and head k % RP.
  constexpr int NTP = NT <= 1 ? 1 : NT <= 2 ? 2 : NT <= 4 ? 4 : 8;
  constexpr int RP = REPS <= 1 ? 1 : REPS <= 2 ? 2 : REPS <= 4 ? 4 : REPS <= 8 ? 8 : REPS <= 16 ? 16 : 32;
  constexpr int LGR = RP == 1 ? 0 : RP == 2 ? 1 : RP == 4 ? 2 : RP == 8 ? 3 : RP == 16 ? 4 : 5;
  constexpr int VP = NTP * RP;
  constexpr int LGV = LGR + (NTP == 1 ? 0 : NTP == 2 ? 1 : NTP == 4 ? 2 : 3);
  static_assert(VP <= 32, "the tile's NT x REPS scores must fit the warp's lanes");
  constexpr int SH = 5 - LGV;
  const int j_own = (lane >> SH) / RP;
  const int r_own = (lane >> SH) % RP;
  const bool own_live = j_own < NT && r_own < REPS;
  float qv[REPS][EK];
  float m[REPS];
  float l[REPS];
  float o[REPS][EV];
  ${o.unroll}
  for (int r = 0; r < REPS; ++r) {
    const int hq = h * NREP + rg * REPS + r;
    ${o.unroll}
    for (int i = 0; i < EK; ++i) {
      qv[r][i] = static_cast<float>(q[b * q_strides[0] + hq * q_strides[1] + (lane * EK + i) * q_strides[3]]);
    }
    m[r] = ${o.negInf};
    l[r] = 0.0f;
    ${o.unroll}
    for (int i = 0; i < EV; ++i) o[r][i] = 0.0f;
  }
  // A run past the last token is empty (every warp reaches the barrier below).
  const int64_t t0l = ((int64_t)tg * WARPS + wid) * RUN;
  const int t0 = t0l < T_LEN ? (int)t0l : T_LEN;
  const int t1 = (t0 + RUN < T_LEN) ? t0 + RUN : T_LEN;
  const int64_t mrow = (mask_shape[0] == 1 ? 0 : b) * mask_strides[0];
  const int64_t mstride = mask_shape[3] == 1 ? 0 : mask_strides[3];
  // MASK_MODE 0: one boolean for every key (no mask, or causal at the last position), read once.
  const float mask0 = static_cast<float>(mask[0]);${key.prelude}${value.prelude}${key.score?.prelude ?? ""}
  ${fastLoops}
  ${o.shared} float sm_m[WARPS][REPS];
  ${o.shared} float sm_l[WARPS][REPS];
  ${o.shared} float sm_o[WARPS][REPS][DV];
  ${o.unroll}
  for (int r = 0; r < REPS; ++r) {
    if (lane == 0) {
      sm_m[wid][r] = m[r];
      sm_l[wid][r] = l[r];
    }
    ${o.unroll}
    for (int i = 0; i < EV; ++i) sm_o[wid][r][lane * EV + i] = o[r][i];
  }
  ${o.barrier}
  for (int e = tid; e < REPS * DV; e += WARPS * 32) {
    const int r = e / DV;
    const int d = e - r * DV;
    float top = ${o.negInf};
    for (int w = 0; w < WARPS; ++w) top = ${o.max}(top, sm_m[w][r]);
    float acc = 0.0f;
    float den = 0.0f;
    for (int w = 0; w < WARPS; ++w) {
      const float wt = (sm_m[w][r] == ${o.negInf}) ? 0.0f : ${o.exp}(sm_m[w][r] - top);
      acc += wt * sm_o[w][r][d];
      den += wt * sm_l[w][r];
    }
    const int64_t at = ((int64_t)b * HQ + h * NREP + rg * REPS + r) * NG + tg;
    po[at * DV + d] = acc;
    if (d == 0) {
      pm[at] = top;
      pl[at] = den;
    }
  }
`;
  return text.replaceAll(UNROLL, o.unroll);
}

/**
 * Pass 2: one threadgroup of COMBINE_WARPS warps per (row b·Hq + hq, block of 32 output
 * elements). Every warp finds M = max m_p and the denominator Σ w_p l_p (w_p = exp(m_p − M)),
 * its lanes splitting the partials; then warp w sums w_p o_p,d over the partials p ≡ w (mod
 * COMBINE_WARPS) for lane d of the block, and the warps' sums are added in threadgroup memory;
 * out_d = Σ / denominator, rounded once to T. (One thread per element looping over every partial
 * took a serial chain of P loads: 512 partials at 128k tokens.)
 */
export function combineSource(backend: Backend): string {
  const o = OPS[backend];
  const prelude =
    backend === "cuda"
      ? "  const int tid = (int)threadIdx.x;\n  const int d = (int)blockIdx.x * 32 + (tid & 31);\n  const int64_t row = (int64_t)blockIdx.y;"
      : "  const int tid = (int)thread_position_in_threadgroup.x;\n  const int d = (int)threadgroup_position_in_grid.x * 32 + (tid & 31);\n  const int64_t row = (int64_t)threadgroup_position_in_grid.y;";
  return `${prelude}
  constexpr int W = ${COMBINE_WARPS};
  const int lane = tid & 31;
  const int wid = tid >> 5;
  const int NP = pm_shape[1];
  const int64_t base = row * NP;
  float mmax = ${o.negInf};
  ${backend === "cuda" ? "#pragma unroll 4" : ""}
  for (int p = lane; p < NP; p += 32) mmax = ${o.max}(mmax, pm[base + p]);
  ${o.warpMax("mmax")}
  float den = 0.0f;
  ${backend === "cuda" ? "#pragma unroll 4" : ""}
  for (int p = lane; p < NP; p += 32) {
    const float mp = pm[base + p];
    den += ((mp == ${o.negInf}) ? 0.0f : ${o.exp}(mp - mmax)) * pl[base + p];
  }
  ${o.warpSum("den")}
  float acc = 0.0f;
  ${backend === "cuda" ? "#pragma unroll 8" : ""}
  for (int p = wid; p < NP; p += W) {
    const float mp = pm[base + p];
    const float w = (mp == ${o.negInf}) ? 0.0f : ${o.exp}(mp - mmax);
    acc += w * po[(base + p) * DV + d];
  }
  ${o.shared} float sm[W][32];
  sm[wid][lane] = acc;
  ${o.barrier}
  if (wid == 0) {
    float total = 0.0f;
    for (int w = 0; w < W; ++w) total += sm[w][lane];
    out[row * DV + d] = static_cast<T>(total / den);
  }
`;
}
