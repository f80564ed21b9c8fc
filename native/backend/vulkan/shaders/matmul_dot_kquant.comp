// Y (T, rows) = W (rows, cols) @ X (T, cols)^T with integer dot products for the newer formats, by WTYPE (the
// GGUF type id: 6 Q5_0, 7 Q5_1, 10 Q2_K, 11 Q3_K, 12 Q4_K, 13 Q5_K, 14 Q6_K, 20 IQ4_NL, 23 IQ4_XS;
// CMakeLists.txt builds each). X arrives quantized by quantize_q8.comp (BlockQ8A per 32 elements). Each
// 32-element block (a K-quant sub-block: chunk j of super-block s is elements 256s + 32j ..) goes into a
// thread's running sum as kernels/ref.cpp's dot_q does (decode32 + dot_terms):
//   qa[h] = sum over 16-element half h of q * q_a, xs[h] = sum of q_a   (packed 4x8-bit dots, exact)
//   isum = sc[0] qa[0] + sc[1] qa[1];  acc = fma(isum, d * d_a, acc)
//   with a minimum (Q5_0's -16 d, Q5_1, Q4_K, Q5_K): acc = fma(m, ds_a, acc)
//   Q2_K's 16-element mins: acc = fma(-(mn[0] xs[0] + mn[1] xs[1]), dmin * d_a, acc)
// where q is the quant as the dot uses it (Q5_0 unsigned, Q6_K q - 32, Q3_K signed, IQ4 the level), sc the
// integer 16-element scales (Q6_K, Q3_K, Q2_K; 1 elsewhere) and d the float scale (the sub-block's for Q4_K,
// Q5_K, IQ4_XS). precise: no other contraction. Dispatch, push constants and the SUBGROUP=1 variant are
// matmul.comp's (and matmul_dot.comp's).
#version 450
#extension GL_EXT_control_flow_attributes : enable
#extension GL_EXT_spirv_intrinsics : require
#ifndef SUBGROUP
#define SUBGROUP 0
#endif
#if SUBGROUP
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_arithmetic : enable
#endif

#if SUBGROUP
#define THREADS 256
#else
#define THREADS 64
#endif
#define ROWS_PER_PASS 8
#define QK 32
#define ACT_WORDS 10  // sizeof(BlockQ8A) / 4: {d, ds, 8 words of int8}

// OpSDot (4450), PackedVectorFormat4x8Bit: capabilities DotProductInput4x8BitPacked (6019), DotProduct (6018).
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot4x8(uint a, uint b, spirv_literal int packed_format);

layout(local_size_x = THREADS) in;

layout(std430, binding = 0) readonly buffer Weights { uint w[]; };  // raw GGUF row bytes, little-endian
layout(std430, binding = 1) readonly buffer Acts { uint qa[]; };    // (T, cols / 32) BlockQ8A
layout(std430, binding = 2) writeonly buffer Out { float y[]; };    // (T, rows)

layout(push_constant) uniform Params {
  uint rows;
  uint cols;
  uint T;
  uint row_bytes;
  uint rows_per_group;
} p;

#if !SUBGROUP
shared float red[ROWS_PER_PASS][THREADS];
#endif

uint byte_at(uint o) { return (w[o >> 2] >> ((o & 3u) * 8u)) & 0xFFu; }
int sbyte_at(uint o) { return int(byte_at(o) << 24) >> 24; }
// IEEE half bits -> float, exact for subnormal halves too (matmul.comp's; fp16_to_fp32 on the CPU).
float h2f(uint h) {
  const uint e = (h >> 10) & 31u;
  const uint m = h & 1023u;
  const float s = (h & 0x8000u) != 0u ? -1.0 : 1.0;
  if (e == 0u) return s * float(m) * 5.9604644775390625e-8;  // m * 2^-24
  if (e == 31u) return uintBitsToFloat(((h & 0x8000u) << 16) | 0x7F800000u | (m << 13));
  return uintBitsToFloat(((h & 0x8000u) << 16) | ((e + 112u) << 23) | (m << 13));
}
float half_at(uint o) { return h2f(byte_at(o) | byte_at(o + 1u) << 8); }

#if WTYPE == 20 || WTYPE == 23
// kIq4Levels (quant.h): the 16 signed levels of the non-linear 4-bit formats.
const int kLevels[16] = int[16](-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
#endif

// Element l of the block as lane l % 4 of word l / 4.
void put(inout uint q[8], uint l, int v) { q[l >> 2] |= (uint(v) & 0xFFu) << (8u * (l & 3u)); }

#if WTYPE == 6 || WTYPE == 7 || WTYPE == 12 || WTYPE == 13
#define DS_TERM 1
#else
#define DS_TERM 0
#endif

// Block b of the row at byte rbase as dot_terms gives it: quants q (packed), integer half scales sc and (Q2_K)
// mins mn, float scale d and m (the a.ds coefficient, or Q2_K's dmin).
void decode_terms(uint rbase, uint b, out uint q[8], out int sc[2], out int mn[2], out float d, out float m) {
  [[unroll]] for (uint k = 0; k < 8u; ++k) q[k] = 0u;
  sc[0] = 1;
  sc[1] = 1;
  mn[0] = 0;
  mn[1] = 0;
  m = 0.0;
#if WTYPE == 6 || WTYPE == 7
#if WTYPE == 6
  const uint blk = rbase + b * 22u;  // BlockQ5_0 {f16 d; u8 qh[4]; u8 qs[16]}: unsigned q, m = -16 d
  const uint qh = byte_at(blk + 2u) | byte_at(blk + 3u) << 8 | byte_at(blk + 4u) << 16 | byte_at(blk + 5u) << 24;
  const uint qs = blk + 6u;
  d = half_at(blk);
  m = -16.0 * d;
#else
  const uint blk = rbase + b * 24u;  // BlockQ5_1 {f16 d; f16 m; u8 qh[4]; u8 qs[16]}: unsigned q
  const uint qh = byte_at(blk + 4u) | byte_at(blk + 5u) << 8 | byte_at(blk + 6u) << 16 | byte_at(blk + 7u) << 24;
  const uint qs = blk + 8u;
  d = half_at(blk);
  m = half_at(blk + 2u);
#endif
  for (uint l = 0; l < QK; ++l) {
    const uint nib = l < 16u ? byte_at(qs + l) & 15u : byte_at(qs + l - 16u) >> 4;
    put(q, l, int(nib | ((qh >> l) & 1u) << 4));
  }
#elif WTYPE == 20
  const uint blk = rbase + b * 18u;  // BlockIQ4_NL {f16 d; u8 qs[16]}: the level of each nibble
  for (uint l = 0; l < QK; ++l) {
    put(q, l, kLevels[l < 16u ? byte_at(blk + 2u + l) & 15u : byte_at(blk + 2u + l - 16u) >> 4]);
  }
  d = half_at(blk);
#else
  const uint sb = b >> 3;  // super-block
  const uint j = b & 7u;   // 32-element sub-block inside it
#if WTYPE == 23
  const uint blk = rbase + sb * 136u;  // BlockIQ4_XS {f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]}
  const uint qs = blk + 8u + 16u * j;
  for (uint l = 0; l < QK; ++l) put(q, l, kLevels[l < 16u ? byte_at(qs + l) & 15u : byte_at(qs + l - 16u) >> 4]);
  const uint scales_h = byte_at(blk + 2u) | byte_at(blk + 3u) << 8;
  const int ls = int(((byte_at(blk + 4u + j / 2u) >> (4u * (j % 2u))) & 15u) | ((scales_h >> (2u * j)) & 3u) << 4);
  precise float dl = half_at(blk) * float(ls - 32);
  d = dl;
#elif WTYPE == 12 || WTYPE == 13
#if WTYPE == 12
  const uint blk = rbase + sb * 144u;  // BlockQ4_K {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}
  const uint qs = blk + 16u + 32u * (j / 2u);
#else
  const uint blk = rbase + sb * 176u;  // BlockQ5_K {f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}
  const uint qs = blk + 48u + 32u * (j / 2u);
#endif
  for (uint l = 0; l < QK; ++l) {
    uint v = (byte_at(qs + l) >> (4u * (j % 2u))) & 15u;
#if WTYPE == 13
    v |= ((byte_at(blk + 16u + l) >> j) & 1u) << 4;
#endif
    put(q, l, int(v));
  }
  const uint scb = blk + 4u;  // quant.h k_scale_min
  uint scale, mins;
  if (j < 4u) {
    scale = byte_at(scb + j) & 63u;
    mins = byte_at(scb + j + 4u) & 63u;
  } else {
    scale = (byte_at(scb + j + 4u) & 15u) | ((byte_at(scb + j - 4u) >> 6) << 4);
    mins = (byte_at(scb + j + 4u) >> 4) | ((byte_at(scb + j) >> 6) << 4);
  }
  precise float dl = half_at(blk) * float(scale);
  precise float ml = half_at(blk + 2u) * float(mins);
  d = dl;
  m = -ml;
#elif WTYPE == 14
  const uint blk = rbase + sb * 210u;  // BlockQ6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}: q - 32
  const uint h = j / 4u;               // 128-element half
  const uint r0 = 32u * (j % 4u);      // offset of this sub-block inside the half
  for (uint l = 0; l < QK; ++l) {
    const uint r = r0 + l;
    const uint lo = (byte_at(blk + 64u * h + r % 64u) >> (4u * (r / 64u))) & 15u;
    const uint hi = (byte_at(blk + 128u + 32u * h + r % 32u) >> (2u * (r / 32u))) & 3u;
    put(q, l, int(lo | hi << 4) - 32);
  }
  d = half_at(blk + 208u);
  [[unroll]] for (uint k = 0; k < 2u; ++k) sc[k] = sbyte_at(blk + 192u + 2u * j + k);
#elif WTYPE == 11
  const uint blk = rbase + sb * 110u;  // BlockQ3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}
  for (uint l = 0; l < QK; ++l) {
    const uint e = 32u * j + l;
    const int low = int((byte_at(blk + 32u + 32u * (e / 128u) + l) >> (2u * ((e % 128u) / 32u))) & 3u);
    const uint high = (byte_at(blk + l) >> (e / 32u)) & 1u;
    put(q, l, low - (high != 0u ? 0 : 4));
  }
  d = half_at(blk + 108u);
  [[unroll]] for (uint k = 0; k < 2u; ++k) {
    const uint sbi = 2u * j + k;  // quant.h q3k_scale
    const uint lo = (byte_at(blk + 96u + sbi % 8u) >> (4u * (sbi / 8u))) & 15u;
    const uint hi = (byte_at(blk + 104u + sbi % 4u) >> (2u * (sbi / 4u))) & 3u;
    sc[k] = int(lo | hi << 4) - 32;
  }
#elif WTYPE == 10
  const uint blk = rbase + sb * 84u;  // BlockQ2_K {u8 scales[16]; u8 qs[64]; f16 d; f16 dmin}
  for (uint l = 0; l < QK; ++l) {
    const uint e = 32u * j + l;
    put(q, l, int((byte_at(blk + 16u + 32u * (e / 128u) + l) >> (2u * ((e % 128u) / 32u))) & 3u));
  }
  d = half_at(blk + 80u);
  m = half_at(blk + 82u);
  [[unroll]] for (uint k = 0; k < 2u; ++k) {
    const uint s = byte_at(blk + 2u * j + k);
    sc[k] = int(s & 15u);
    mn[k] = int(s >> 4);
  }
#else
#error "WTYPE must be 6, 7, 10, 11, 12, 13, 14, 20 or 23"
#endif
#endif
}

// acc + block b of the weight row against block b of activation row t, as dot_q's chain of fmas.
float block_fma(const uint q[8], const int sc[2], const int mn[2], float d, float m, uint t, uint b, uint nblk,
                float acc) {
  const uint a = (t * nblk + b) * ACT_WORDS;
  int qa_sum[2] = int[2](0, 0);
  int a_sum[2] = int[2](0, 0);
  [[unroll]] for (uint k = 0; k < 8u; ++k) {
    const uint aw = qa[a + 2u + k];
    qa_sum[k / 4u] += sdot4x8(q[k], aw, 0);
#if WTYPE == 10
    a_sum[k / 4u] += sdot4x8(aw, 0x01010101u, 0);
#endif
  }
  const float ad = uintBitsToFloat(qa[a]);
  precise float dd = d * ad;
  precise float v = fma(float(sc[0] * qa_sum[0] + sc[1] * qa_sum[1]), dd, acc);
#if DS_TERM
  v = fma(m, uintBitsToFloat(qa[a + 1u]), v);
#endif
#if WTYPE == 10
  precise float md = m * ad;
  v = fma(-float(mn[0] * a_sum[0] + mn[1] * a_sum[1]), md, v);
#endif
  return v;
}

#if SUBGROUP
void main() {
  const uint g = gl_WorkGroupID.x + gl_WorkGroupID.z * gl_NumWorkGroups.x;
  const uint r_end = min(p.rows, (g + 1u) * p.rows_per_group);
  const uint t0 = gl_WorkGroupID.y * ROWS_PER_PASS;
  const uint nt = min(uint(ROWS_PER_PASS), p.T - t0);
  const uint nblk = p.cols / QK;
  for (uint r = g * p.rows_per_group + gl_SubgroupID; r < r_end; r += gl_NumSubgroups) {
    const uint rbase = r * p.row_bytes;
    float acc[ROWS_PER_PASS];
    [[unroll]] for (uint t = 0; t < ROWS_PER_PASS; ++t) acc[t] = 0.0;
    for (uint b = gl_SubgroupInvocationID; b < nblk; b += gl_SubgroupSize) {
      uint q[8];
      int sc[2], mn[2];
      float d, m;
      decode_terms(rbase, b, q, sc, mn, d, m);
      [[unroll]] for (uint t = 0; t < ROWS_PER_PASS; ++t) {
        if (t < nt) acc[t] = block_fma(q, sc, mn, d, m, t0 + t, b, nblk, acc[t]);
      }
    }
    [[unroll]] for (uint t = 0; t < ROWS_PER_PASS; ++t) acc[t] = subgroupAdd(acc[t]);
    if (subgroupElect()) {
      for (uint t = 0; t < nt; ++t) y[(t0 + t) * p.rows + r] = acc[t];
    }
  }
}
#else
void main() {
  const uint r = gl_WorkGroupID.x + gl_WorkGroupID.z * gl_NumWorkGroups.x;
  if (r >= p.rows) return;  // uniform over the workgroup
  const uint t0 = gl_WorkGroupID.y * ROWS_PER_PASS;
  const uint nt = min(uint(ROWS_PER_PASS), p.T - t0);
  const uint lid = gl_LocalInvocationID.x;
  const uint rbase = r * p.row_bytes;
  const uint nblk = p.cols / QK;

  float acc[ROWS_PER_PASS];
  [[unroll]] for (uint t = 0; t < ROWS_PER_PASS; ++t) acc[t] = 0.0;
  for (uint b = lid; b < nblk; b += THREADS) {
    uint q[8];
    int sc[2], mn[2];
    float d, m;
    decode_terms(rbase, b, q, sc, mn, d, m);
    for (uint t = 0; t < nt; ++t) acc[t] = block_fma(q, sc, mn, d, m, t0 + t, b, nblk, acc[t]);
  }
  [[unroll]] for (uint t = 0; t < ROWS_PER_PASS; ++t) red[t][lid] = acc[t];
  barrier();
  [[unroll]] for (uint s = THREADS / 2; s > 0; s >>= 1) {
    if (lid < s) {
      [[unroll]] for (uint t = 0; t < ROWS_PER_PASS; ++t) red[t][lid] += red[t][lid + s];
    }
    barrier();
  }
  if (lid == 0) {
    for (uint t = 0; t < nt; ++t) y[(t0 + t) * p.rows + r] = red[t][0];
  }
}
#endif
