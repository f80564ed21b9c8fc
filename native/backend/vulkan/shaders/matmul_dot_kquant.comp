// Y (T, rows) = W (rows, cols) @ X (T, cols)^T with integer dot products for the newer formats, by WTYPE (the
// GGUF type id: 6 Q5_0, 7 Q5_1, 10 Q2_K, 11 Q3_K, 12 Q4_K, 13 Q5_K, 14 Q6_K, 20 IQ4_NL, 23 IQ4_XS;
// CMakeLists.txt builds each). X arrives quantized by quantize_q8.comp (BlockQ8A per 32 elements). Each
// 32-element block (a K-quant sub-block: chunk j of super-block s is elements 256s + 32j ..) is decoded as
// kernels/ref.cpp's decode32 — integer quants q (signed 8-bit lanes: Q5_0 q - 16, Q6_K q - 32, IQ4 the level;
// unsigned where a min is kept) and per 16-element half h an affine map s[h] * q + o[h] — and dotted as its
// dot_q: per half, qa = sum q * q_a and as = sum q_a (packed 4x8-bit dots, exact), then
//   part = (s0 qa0 + o0 as0) + (s1 qa1 + o1 as1);  term = d_a * part
// in the CPU's order of float operations (precise: no fused multiply-add), summed over the row's blocks.
// Dispatch, push constants and the SUBGROUP=1 variant are matmul.comp's (and matmul_dot.comp's).
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

// Block b of the row at byte rbase as decode32 gives it: quants q (packed) and s[h], o[h] per 16-element half.
void decode32(uint rbase, uint b, out uint q[8], out float s[2], out float o[2]) {
  [[unroll]] for (uint k = 0; k < 8u; ++k) q[k] = 0u;
  o[0] = 0.0;
  o[1] = 0.0;
#if WTYPE == 6 || WTYPE == 7
#if WTYPE == 6
  const uint blk = rbase + b * 22u;  // BlockQ5_0 {f16 d; u8 qh[4]; u8 qs[16]}: q - 16
  const uint qh = byte_at(blk + 2u) | byte_at(blk + 3u) << 8 | byte_at(blk + 4u) << 16 | byte_at(blk + 5u) << 24;
  const uint qs = blk + 6u;
  const int off = 16;
#else
  const uint blk = rbase + b * 24u;  // BlockQ5_1 {f16 d; f16 m; u8 qh[4]; u8 qs[16]}: q unsigned, o = m
  const uint qh = byte_at(blk + 4u) | byte_at(blk + 5u) << 8 | byte_at(blk + 6u) << 16 | byte_at(blk + 7u) << 24;
  const uint qs = blk + 8u;
  const int off = 0;
  o[0] = half_at(blk + 2u);
  o[1] = o[0];
#endif
  for (uint l = 0; l < QK; ++l) {
    const uint nib = l < 16u ? byte_at(qs + l) & 15u : byte_at(qs + l - 16u) >> 4;
    put(q, l, int(nib | ((qh >> l) & 1u) << 4) - off);
  }
  s[0] = half_at(blk);
  s[1] = s[0];
#elif WTYPE == 20
  const uint blk = rbase + b * 18u;  // BlockIQ4_NL {f16 d; u8 qs[16]}: the level of each nibble
  for (uint l = 0; l < QK; ++l) {
    put(q, l, kLevels[l < 16u ? byte_at(blk + 2u + l) & 15u : byte_at(blk + 2u + l - 16u) >> 4]);
  }
  s[0] = half_at(blk);
  s[1] = s[0];
#else
  const uint sb = b >> 3;   // super-block
  const uint j = b & 7u;    // 32-element sub-block inside it
#if WTYPE == 23
  const uint blk = rbase + sb * 136u;  // BlockIQ4_XS {f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]}
  const uint qs = blk + 8u + 16u * j;
  for (uint l = 0; l < QK; ++l) put(q, l, kLevels[l < 16u ? byte_at(qs + l) & 15u : byte_at(qs + l - 16u) >> 4]);
  const uint scales_h = byte_at(blk + 2u) | byte_at(blk + 3u) << 8;
  const int ls = int(((byte_at(blk + 4u + j / 2u) >> (4u * (j % 2u))) & 15u) | ((scales_h >> (2u * j)) & 3u) << 4);
  precise float sc = half_at(blk) * float(ls - 32);
  s[0] = sc;
  s[1] = sc;
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
  const uint sc = blk + 4u;  // quant.h k_scale_min
  uint scale, mn;
  if (j < 4u) {
    scale = byte_at(sc + j) & 63u;
    mn = byte_at(sc + j + 4u) & 63u;
  } else {
    scale = (byte_at(sc + j + 4u) & 15u) | ((byte_at(sc + j - 4u) >> 6) << 4);
    mn = (byte_at(sc + j + 4u) >> 4) | ((byte_at(sc + j) >> 6) << 4);
  }
  precise float dl = half_at(blk) * float(scale);
  precise float ml = half_at(blk + 2u) * float(mn);
  s[0] = dl;
  s[1] = dl;
  o[0] = -ml;
  o[1] = -ml;
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
  const float d = half_at(blk + 208u);
  [[unroll]] for (uint k = 0; k < 2u; ++k) {
    precise float v = d * float(sbyte_at(blk + 192u + 2u * j + k));
    s[k] = v;
  }
#elif WTYPE == 11
  const uint blk = rbase + sb * 110u;  // BlockQ3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}
  for (uint l = 0; l < QK; ++l) {
    const uint e = 32u * j + l;
    const int low = int((byte_at(blk + 32u + 32u * (e / 128u) + l) >> (2u * ((e % 128u) / 32u))) & 3u);
    const uint high = (byte_at(blk + l) >> (e / 32u)) & 1u;
    put(q, l, low - (high != 0u ? 0 : 4));
  }
  const float d = half_at(blk + 108u);
  [[unroll]] for (uint k = 0; k < 2u; ++k) {
    const uint sbi = 2u * j + k;  // quant.h q3k_scale
    const uint lo = (byte_at(blk + 96u + sbi % 8u) >> (4u * (sbi / 8u))) & 15u;
    const uint hi = (byte_at(blk + 104u + sbi % 4u) >> (2u * (sbi / 4u))) & 3u;
    precise float v = d * float(int(lo | hi << 4) - 32);
    s[k] = v;
  }
#elif WTYPE == 10
  const uint blk = rbase + sb * 84u;  // BlockQ2_K {u8 scales[16]; u8 qs[64]; f16 d; f16 dmin}
  for (uint l = 0; l < QK; ++l) {
    const uint e = 32u * j + l;
    put(q, l, int((byte_at(blk + 16u + 32u * (e / 128u) + l) >> (2u * ((e % 128u) / 32u))) & 3u));
  }
  const float d = half_at(blk + 80u);
  const float dmin = half_at(blk + 82u);
  [[unroll]] for (uint k = 0; k < 2u; ++k) {
    const uint sc = byte_at(blk + 2u * j + k);
    precise float v = d * float(sc & 15u);
    precise float m = dmin * float(sc >> 4);
    s[k] = v;
    o[k] = -m;
  }
#else
#error "WTYPE must be 6, 7, 10, 11, 12, 13, 14, 20 or 23"
#endif
#endif
}

// Block b of the weight row (q, s, o) against block b of activation row t: dot_q's term.
float block_dot(const uint q[8], const float s[2], const float o[2], uint t, uint b, uint nblk) {
  const uint a = (t * nblk + b) * ACT_WORDS;
  float part = 0.0;
  [[unroll]] for (uint h = 0; h < 2u; ++h) {
    int qa_sum = 0;
    int a_sum = 0;
    [[unroll]] for (uint k = 4u * h; k < 4u * h + 4u; ++k) {
      const uint aw = qa[a + 2u + k];
      qa_sum += sdot4x8(q[k], aw, 0);
      a_sum += sdot4x8(aw, 0x01010101u, 0);
    }
    precise float v = part + (s[h] * float(qa_sum) + o[h] * float(a_sum));
    part = v;
  }
  precise float term = uintBitsToFloat(qa[a]) * part;
  return term;
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
      float s[2], o[2];
      decode32(rbase, b, q, s, o);
      [[unroll]] for (uint t = 0; t < ROWS_PER_PASS; ++t) {
        if (t < nt) acc[t] += block_dot(q, s, o, t0 + t, b, nblk);
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
    float s[2], o[2];
    decode32(rbase, b, q, s, o);
    for (uint t = 0; t < nt; ++t) acc[t] += block_dot(q, s, o, t0 + t, b, nblk);
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
