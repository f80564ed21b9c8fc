// Y (T, rows) = W (rows, cols) @ X (T, cols)^T for the newer GGUF weight formats, chosen at build time
// by WTYPE (the GGUF type id: 6 Q5_0, 7 Q5_1, 10 Q2_K, 11 Q3_K, 12 Q4_K, 13 Q5_K, 14 Q6_K, 20 IQ4_NL,
// 23 IQ4_XS, 30 BF16; CMakeLists.txt builds each). The byte layouts are native/quant.h's (ggml's).
// The same contract, bindings, push constants and dispatch as matmul.comp: one workgroup per
// (weight row, pass of up to ROWS_PER_PASS activation rows); each thread decodes 32-element chunks of
// the weight row once per pass (for the 256-element K-quant super-blocks, chunk j of super-block s is
// elements 256s + 32j ..) and dots each with every activation row of the pass.
// SUBGROUP=1 builds the variant the backend picks where subgroup arithmetic runs in compute shaders, as
// matmul.comp's: each subgroup reduces one weight row with subgroupAdd, a workgroup covers rows_per_group
// rows. Either variant gives a row the same sum whatever T is (batch invariance).
// Float path: weights decoded to float, float32 accumulation. The integer-dot path (q8 activations,
// packed 4x8 dots) of these formats is matmul_dot_kquant.comp (docs/GPU.md "Integer dot products").
#version 450
#extension GL_EXT_control_flow_attributes : enable
#ifndef SUBGROUP
#define SUBGROUP 0
#endif
#if SUBGROUP
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_arithmetic : enable
#endif

#if SUBGROUP
#define THREADS 256  // a workgroup of THREADS / subgroup size rows; kMatmulSgThreads in vulkan_backend.cpp
#else
#define THREADS 64
#endif
#define ROWS_PER_PASS 8  // activation rows served per weight-row read; must equal matmul.comp's
#define QK 32            // elements per chunk: a Q5_0/Q5_1/IQ4_NL block, a K-quant sub-block of 32, 32 BF16

layout(local_size_x = THREADS) in;

layout(std430, binding = 0) readonly buffer Weights { uint w[]; };  // raw GGUF row bytes, little-endian
layout(std430, binding = 1) readonly buffer Acts { float x[]; };    // (T, cols)
layout(std430, binding = 2) writeonly buffer Out { float y[]; };    // (T, rows)

layout(push_constant) uniform Params {
  uint rows;
  uint cols;  // a multiple of the format's block (32, or 256 for the K-quants and IQ4_XS); any for BF16
  uint T;
  uint row_bytes;       // bytes of one weight row
  uint rows_per_group;  // SUBGROUP: weight rows per workgroup (1 otherwise)
} p;

#if !SUBGROUP
shared float red[ROWS_PER_PASS][THREADS];
#endif

uint byte_at(uint o) { return (w[o >> 2] >> ((o & 3u) * 8u)) & 0xFFu; }
int sbyte_at(uint o) { return int(byte_at(o) << 24) >> 24; }
// o even: halves never straddle a word.
float half_at(uint o) { return unpackHalf2x16((w[o >> 2] >> ((o & 2u) * 8u)) & 0xFFFFu).x; }
// Bytes o .. o + 3 (all inside the buffer), little-endian, in one word load or two: the decoders read the
// quants 4 bytes at a time and unpack all four lanes with one shift and mask (bytes never mix: every mask
// keeps bits below the shift's reach into the next byte).
uint u32_at(uint o) {
  const uint i = o >> 2;
  const uint sh = (o & 3u) * 8u;
  const uint lo = w[i];
  return sh == 0u ? lo : (lo >> sh) | (w[i + 1u] << (32u - sh));
}
uint lane(uint x, uint k) { return (x >> (8u * k)) & 0xFFu; }

#if WTYPE == 20 || WTYPE == 23
// kIq4Levels (quant.h): the 16 signed levels of the non-linear 4-bit formats.
const float kLevels[16] = float[16](-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0, 1.0, 13.0, 25.0,
                                    38.0, 53.0, 69.0, 89.0, 113.0);
#endif

#if WTYPE == 12 || WTYPE == 13
// Scale and min (6 bits each) of sub-block j < 8 of a Q4_K / Q5_K super-block (quant.h k_scale_min).
void k_scale_min(uint s, uint j, out float sc, out float mn) {
  if (j < 4u) {
    sc = float(byte_at(s + j) & 63u);
    mn = float(byte_at(s + j + 4u) & 63u);
  } else {
    sc = float((byte_at(s + j + 4u) & 15u) | ((byte_at(s + j - 4u) >> 6) << 4));
    mn = float((byte_at(s + j + 4u) >> 4) | ((byte_at(s + j) >> 6) << 4));
  }
}
#endif

// Elements 32b .. 32b + 31 of the row at byte rbase (zeros past cols for BF16).
void decode(uint rbase, uint b, out float v[QK]) {
#if WTYPE == 30
  // bfloat16: the top half of a float32. o even: halves never straddle a word.
  [[unroll]] for (uint i = 0; i < QK; ++i) {
    const uint o = rbase + 2u * (b * QK + i);
    v[i] = b * QK + i < p.cols ? uintBitsToFloat(((w[o >> 2] >> ((o & 2u) * 8u)) & 0xFFFFu) << 16) : 0.0;
  }
#elif WTYPE == 6 || WTYPE == 7
#if WTYPE == 6
  const uint blk = rbase + b * 22u;  // BlockQ5_0 {f16 d; u8 qh[4]; u8 qs[16]}
  const float d = half_at(blk);
  const float m = -16.0 * d;  // value = (q - 16) * d
  const uint qs = blk + 6u;
  const uint qh = u32_at(blk + 2u);
#else
  const uint blk = rbase + b * 24u;  // BlockQ5_1 {f16 d; f16 m; u8 qh[4]; u8 qs[16]}
  const float d = half_at(blk);
  const float m = half_at(blk + 2u);  // value = q * d + m
  const uint qs = blk + 8u;
  const uint qh = u32_at(blk + 4u);
#endif
  [[unroll]] for (uint i = 0; i < QK / 2; i += 4u) {
    const uint q4 = u32_at(qs + i);
    [[unroll]] for (uint k = 0; k < 4u; ++k) {
      v[i + k] = float((lane(q4, k) & 15u) | ((qh >> (i + k)) & 1u) << 4) * d + m;
      v[i + k + QK / 2] = float((lane(q4, k) >> 4) | ((qh >> (i + k + 16u)) & 1u) << 4) * d + m;
    }
  }
#elif WTYPE == 20
  const uint blk = rbase + b * 18u;  // BlockIQ4_NL {f16 d; u8 qs[16]}
  const float d = half_at(blk);
  [[unroll]] for (uint i = 0; i < QK / 2; i += 4u) {
    const uint q4 = u32_at(blk + 2u + i);
    [[unroll]] for (uint k = 0; k < 4u; ++k) {
      v[i + k] = d * kLevels[lane(q4, k) & 15u];
      v[i + k + QK / 2] = d * kLevels[lane(q4, k) >> 4];
    }
  }
#else
  // The 256-element super-blocks: chunk j of super-block s.
  const uint s = b >> 3;
  const uint j = b & 7u;
#if WTYPE == 10
  // BlockQ2_K {u8 scales[16]; u8 qs[64]; f16 d; f16 dmin}. Element 32j + l: h = j / 4, shift 2 (j % 4),
  // sub-block of 16: 2j + l / 16.
  const uint blk = rbase + s * 84u;
  const float d = half_at(blk + 80u);
  const float dmin = half_at(blk + 82u);
  const uint qs = blk + 16u + 32u * (j >> 2);
  const uint shift = 2u * (j & 3u);
  [[unroll]] for (uint half16 = 0; half16 < 2u; ++half16) {
    const uint sc = byte_at(blk + 2u * j + half16);
    const float dl = d * float(sc & 15u);
    const float ml = dmin * float(sc >> 4);
    [[unroll]] for (uint l = 0; l < 16u; l += 4u) {
      const uint e = 16u * half16 + l;
      const uint q4 = (u32_at(qs + e) >> shift) & 0x03030303u;
      [[unroll]] for (uint k = 0; k < 4u; ++k) v[e + k] = dl * float(lane(q4, k)) - ml;
    }
  }
#elif WTYPE == 11
  // BlockQ3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}. Element 32j + l: low 2 bits from
  // qs[32 (j / 4) + l] >> 2 (j % 4), high bit (hmask[l] >> j) & 1; q = low - (high ? 0 : 4).
  const uint blk = rbase + s * 110u;
  const float d = half_at(blk + 108u);
  const uint qs = blk + 32u + 32u * (j >> 2);
  const uint shift = 2u * (j & 3u);
  [[unroll]] for (uint half16 = 0; half16 < 2u; ++half16) {
    const uint sb = 2u * j + half16;  // sub-block of 16, signed 6-bit scale (quant.h q3k_scale)
    const uint lo = (byte_at(blk + 96u + (sb & 7u)) >> (4u * (sb >> 3))) & 15u;
    const uint hi = (byte_at(blk + 96u + 8u + (sb & 3u)) >> (2u * (sb >> 2))) & 3u;
    const float dl = d * float(int(lo | hi << 4) - 32);
    [[unroll]] for (uint l = 0; l < 16u; l += 4u) {
      const uint e = 16u * half16 + l;
      const uint low4 = (u32_at(qs + e) >> shift) & 0x03030303u;
      const uint high4 = (u32_at(blk + e) >> j) & 0x01010101u;
      [[unroll]] for (uint k = 0; k < 4u; ++k) {
        v[e + k] = dl * float(int(lane(low4, k)) - (lane(high4, k) != 0u ? 0 : 4));
      }
    }
  }
#elif WTYPE == 12 || WTYPE == 13
  // BlockQ4_K {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}; BlockQ5_K adds u8 qh[32] before qs.
  // Element 32j + l: nibble (qs[32 (j / 2) + l] >> 4 (j % 2)) & 15; Q5_K's fifth bit (qh[l] >> j) & 1.
#if WTYPE == 12
  const uint blk = rbase + s * 144u;
  const uint qs = blk + 16u + 32u * (j >> 1);
#else
  const uint blk = rbase + s * 176u;
  const uint qs = blk + 48u + 32u * (j >> 1);
#endif
  float sc, mn;
  k_scale_min(blk + 4u, j, sc, mn);
  const float dl = half_at(blk) * sc;
  const float ml = half_at(blk + 2u) * mn;
  const uint shift = 4u * (j & 1u);
  [[unroll]] for (uint l = 0; l < QK; l += 4u) {
    uint q4 = (u32_at(qs + l) >> shift) & 0x0F0F0F0Fu;
#if WTYPE == 13
    q4 |= ((u32_at(blk + 16u + l) >> j) & 0x01010101u) << 4;
#endif
    [[unroll]] for (uint k = 0; k < 4u; ++k) v[l + k] = dl * float(lane(q4, k)) - ml;
  }
#elif WTYPE == 14
  // BlockQ6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}. Element 128h + r (h = j / 4, r = 32 (j % 4) + l):
  // low 4 bits (ql[64h + r % 64] >> 4 (r / 64)) & 15, high 2 bits (qh[32h + l] >> 2 (j % 4)) & 3, minus 32.
  const uint blk = rbase + s * 210u;
  const float d = half_at(blk + 208u);
  const uint h = j >> 2;
  const uint r0 = 32u * (j & 3u);
  const uint ql = blk + 64u * h + (r0 & 63u);
  const uint lshift = 4u * (r0 >> 6);
  const uint qh = blk + 128u + 32u * h;
  const uint hshift = 2u * (j & 3u);
  [[unroll]] for (uint half16 = 0; half16 < 2u; ++half16) {
    const float dl = d * float(sbyte_at(blk + 192u + 2u * j + half16));
    [[unroll]] for (uint l = 0; l < 16u; l += 4u) {
      const uint e = 16u * half16 + l;
      const uint q4 = ((u32_at(ql + e) >> lshift) & 0x0F0F0F0Fu) | ((u32_at(qh + e) >> hshift) & 0x03030303u) << 4;
      [[unroll]] for (uint k = 0; k < 4u; ++k) v[e + k] = dl * float(int(lane(q4, k)) - 32);
    }
  }
#elif WTYPE == 23
  // BlockIQ4_XS {f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]}: sub-block j's signed 6-bit scale and
  // nibbles qs[16j .. 16j + 16) in Q4_0 order.
  const uint blk = rbase + s * 136u;
  const uint scales_h = byte_at(blk + 2u) | byte_at(blk + 3u) << 8;
  const uint lo = (byte_at(blk + 4u + (j >> 1)) >> (4u * (j & 1u))) & 15u;
  const uint hi = (scales_h >> (2u * j)) & 3u;
  const float dl = half_at(blk) * float(int(lo | hi << 4) - 32);
  const uint qs = blk + 8u + 16u * j;
  [[unroll]] for (uint i = 0; i < QK / 2; i += 4u) {
    const uint q4 = u32_at(qs + i);
    [[unroll]] for (uint k = 0; k < 4u; ++k) {
      v[i + k] = dl * kLevels[lane(q4, k) & 15u];
      v[i + k + QK / 2] = dl * kLevels[lane(q4, k) >> 4];
    }
  }
#else
#error "WTYPE must be 6, 7, 10, 11, 12, 13, 14, 20, 23 or 30"
#endif
#endif
}

// acc[t] += the chunk b of the row at rbase dotted with activation row t0 + t, for t < nt.
void accumulate(uint rbase, uint b, uint t0, uint nt, inout float acc[ROWS_PER_PASS]) {
  float v[QK];
  decode(rbase, b, v);
  const uint e0 = b * QK;
  const uint ne = min(uint(QK), p.cols - e0);  // < QK only in a BF16 row's tail
  [[unroll]] for (uint t = 0; t < ROWS_PER_PASS; ++t) {
    if (t < nt) {
      const uint xo = (t0 + t) * p.cols + e0;
      float s = 0.0;
      if (ne == QK) {  // a whole chunk: constant indices keep v in registers
        [[unroll]] for (uint i = 0; i < QK; ++i) s += v[i] * x[xo + i];
      } else {
        for (uint i = 0; i < ne; ++i) s += v[i] * x[xo + i];
      }
      acc[t] += s;
    }
  }
}

#if SUBGROUP
void main() {
  const uint g = gl_WorkGroupID.x + gl_WorkGroupID.z * gl_NumWorkGroups.x;
  const uint r_end = min(p.rows, (g + 1u) * p.rows_per_group);
  const uint t0 = gl_WorkGroupID.y * ROWS_PER_PASS;
  const uint nt = min(uint(ROWS_PER_PASS), p.T - t0);
  const uint nchunk = (p.cols + QK - 1) / QK;
  // r is uniform over each subgroup, so every lane reaches subgroupAdd.
  for (uint r = g * p.rows_per_group + gl_SubgroupID; r < r_end; r += gl_NumSubgroups) {
    float acc[ROWS_PER_PASS];
    [[unroll]] for (uint t = 0; t < ROWS_PER_PASS; ++t) acc[t] = 0.0;
    for (uint b = gl_SubgroupInvocationID; b < nchunk; b += gl_SubgroupSize) {
      accumulate(r * p.row_bytes, b, t0, nt, acc);
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
  const uint nchunk = (p.cols + QK - 1) / QK;

  float acc[ROWS_PER_PASS];
  [[unroll]] for (uint t = 0; t < ROWS_PER_PASS; ++t) acc[t] = 0.0;
  for (uint b = lid; b < nchunk; b += THREADS) accumulate(rbase, b, t0, nt, acc);
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
