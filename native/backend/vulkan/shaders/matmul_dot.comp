// Y (T, rows) = W (rows, cols) @ X (T, cols)^T with integer dot products, for the formats of WTYPE (the
// GGUF type id: 2 Q4_0, 3 Q4_1, 8 Q8_0; CMakeLists.txt builds each). X arrives quantized by quantize_q8.comp
// (QA: BlockQ8A per 32 elements, kernels.h), and each 32-element block goes into a thread's running sum as
// kernels/ref.cpp's dot_q does:
//   s = sum_i q_w[i] * q_a[i]   (8 packed 4x8-bit signed dots, OpSDot: exact int32)
//   acc = fma(s, d_w * d_a, acc), then Q4_0: acc = fma(-8 d_w, ds_a, acc); Q4_1: acc = fma(m_w, ds_a, acc)
// (precise: no other contraction), and the threads' sums are added in a tree (or subgroupAdd).
// Q4 nibbles 0..15 are valid signed 8-bit lanes, so one signed dot serves every format.
// Dispatch, push constants and the SUBGROUP=1 variant are matmul.comp's: one workgroup per (weight row, pass
// of ROWS_PER_PASS activation rows), or one subgroup per row; the same row gives the same sum whatever T is.
// Needs the shaderIntegerDotProduct feature (Vulkan 1.3 or VK_KHR_shader_integer_dot_product), enabled
// at vkCreateDevice by the backend, which picks these shaders only then.
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

// OpSDot (4450) with PackedVectorFormat4x8Bit (0): the sum of the four signed 8-bit lane products.
// Capabilities DotProductInput4x8BitPacked (6019) and DotProduct (6018). Debian 12's glslc lacks
// GL_EXT_integer_dot_product, so the instruction is declared through GL_EXT_spirv_intrinsics.
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

// IEEE half bits -> float, exact for subnormal halves too (matmul.comp's).
float h2f(uint h) {
  const uint e = (h >> 10) & 31u;
  const uint m = h & 1023u;
  const float s = (h & 0x8000u) != 0u ? -1.0 : 1.0;
  if (e == 0u) return s * float(m) * 5.9604644775390625e-8;  // m * 2^-24
  if (e == 31u) return uintBitsToFloat(((h & 0x8000u) << 16) | 0x7F800000u | (m << 13));
  return uintBitsToFloat(((h & 0x8000u) << 16) | ((e + 112u) << 23) | (m << 13));
}
float half_at(uint o) { return h2f((w[o >> 2] >> ((o & 2u) * 8u)) & 0xFFFFu); }  // o even
// The 4 bytes at o (o even: blocks of 18 and 34 bytes leave quants on half-words).
uint word_at(uint o) {
  const uint i = o >> 2;
  return (o & 2u) == 0u ? w[i] : (w[i] >> 16) | (w[i + 1u] << 16);
}

// The weight block's scale d (and Q4_1's minimum m) and its 32 quants as 8 words: lane j of word k is
// element 4k + j (Q4: nibble values 0..15).
void load_block(uint rbase, uint b, out float d, out float m, out uint q[8]) {
#if WTYPE == 2
  const uint blk = rbase + b * 18u;  // BlockQ4_0 {f16 d; u8 qs[16]}: element i low nibble of byte i, 16 + i high
  d = half_at(blk);
  m = 0.0;
  [[unroll]] for (uint k = 0; k < 4; ++k) {
    const uint v = word_at(blk + 2u + 4u * k);
    q[k] = v & 0x0F0F0F0Fu;
    q[k + 4] = (v >> 4) & 0x0F0F0F0Fu;
  }
#elif WTYPE == 3
  const uint blk = rbase + b * 20u;  // BlockQ4_1 {f16 d; f16 m; u8 qs[16]}: word-aligned quants
  d = half_at(blk);
  m = half_at(blk + 2u);
  [[unroll]] for (uint k = 0; k < 4; ++k) {
    const uint v = w[(blk >> 2) + 1u + k];
    q[k] = v & 0x0F0F0F0Fu;
    q[k + 4] = (v >> 4) & 0x0F0F0F0Fu;
  }
#elif WTYPE == 8
  const uint blk = rbase + b * 34u;  // BlockQ8_0 {f16 d; i8 qs[32]}
  d = half_at(blk);
  m = 0.0;
  [[unroll]] for (uint k = 0; k < 8; ++k) q[k] = word_at(blk + 2u + 4u * k);
#else
#error "WTYPE must be 2, 3 or 8"
#endif
}

// acc + block b of the weight row (d, m, q) against block b of activation row t, as dot_q's chain of fmas.
float block_fma(float d, float m, const uint q[8], uint t, uint b, uint nblk, float acc) {
  const uint a = (t * nblk + b) * ACT_WORDS;
  int s = 0;
  [[unroll]] for (uint k = 0; k < 8; ++k) s += sdot4x8(q[k], qa[a + 2u + k], 0);
  precise float dd = d * uintBitsToFloat(qa[a]);
  precise float v = fma(float(s), dd, acc);
#if WTYPE == 2
  v = fma(-8.0 * d, uintBitsToFloat(qa[a + 1u]), v);
#elif WTYPE == 3
  v = fma(m, uintBitsToFloat(qa[a + 1u]), v);
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
      float d, m;
      uint q[8];
      load_block(rbase, b, d, m, q);
      [[unroll]] for (uint t = 0; t < ROWS_PER_PASS; ++t) {
        if (t < nt) acc[t] = block_fma(d, m, q, t0 + t, b, nblk, acc[t]);
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
    float d, m;
    uint q[8];
    load_block(rbase, b, d, m, q);
    for (uint t = 0; t < nt; ++t) acc[t] = block_fma(d, m, q, t0 + t, b, nblk, acc[t]);
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
