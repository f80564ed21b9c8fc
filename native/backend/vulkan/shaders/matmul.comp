// Y (T, rows) = W (rows, cols) @ X (T, cols)^T for one weight format, chosen at build time by
// WTYPE (the GGUF type id: 0 F32, 1 F16, 2 Q4_0, 3 Q4_1, 8 Q8_0; CMakeLists.txt builds each).
// One workgroup per (weight row, pass of up to ROWS_PER_PASS activation rows): the weight row is
// decoded once per pass and dotted with every activation row of the pass (float path; the integer-dot
// path of Q4_0 / Q4_1 / Q8_0 is matmul_dot.comp, docs/GPU.md "Integer dot products").
// SUBGROUP=1 builds the variant the backend picks where subgroup arithmetic runs in compute shaders:
// each subgroup reduces one weight row with subgroupAdd (no shared memory, no barriers), and a workgroup
// covers rows_per_group rows (THREADS / the device's subgroup size; the loop over rows covers them all
// whatever subgroup size the driver really runs). The same row gives the same sum whatever T is.
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
#define THREADS 256  // a workgroup of THREADS / subgroup size rows (fewer, larger workgroups)
#else
#define THREADS 64
#endif
#define ROWS_PER_PASS 8  // activation rows served per weight-row read (registers per thread)
#define QK 32            // elements per block (ggml QK4_0 / QK4_1 / QK8_0)

layout(local_size_x = THREADS) in;

layout(std430, binding = 0) readonly buffer Weights { uint w[]; };  // raw GGUF row bytes, little-endian
layout(std430, binding = 1) readonly buffer Acts { float x[]; };    // (T, cols)
layout(std430, binding = 2) writeonly buffer Out { float y[]; };    // (T, rows)

layout(push_constant) uniform Params {
  uint rows;
  uint cols;
  uint T;
  uint row_bytes;       // bytes of one weight row
  uint rows_per_group;  // SUBGROUP: weight rows per workgroup
} p;

#if !SUBGROUP
shared float red[ROWS_PER_PASS][THREADS];
#endif

uint byte_at(uint o) { return (w[o >> 2] >> ((o & 3u) * 8u)) & 0xFFu; }
// o even: halves never straddle a word.
// IEEE half bits -> float, exact for subnormal halves too (unpackHalf2x16 may flush them to zero, and a
// flushed q8_0 / q4_0 scale zeroes a whole block of 32 elements).
float h2f(uint h) {
  const uint e = (h >> 10) & 31u;
  const uint m = h & 1023u;
  const float s = (h & 0x8000u) != 0u ? -1.0 : 1.0;
  if (e == 0u) return s * float(m) * 5.9604644775390625e-8;  // m * 2^-24
  if (e == 31u) return uintBitsToFloat(((h & 0x8000u) << 16) | 0x7F800000u | (m << 13));
  return uintBitsToFloat(((h & 0x8000u) << 16) | ((e + 112u) << 23) | (m << 13));
}
float half_at(uint o) { return h2f((w[o >> 2] >> ((o & 2u) * 8u)) & 0xFFFFu); }

// Elements b*32 .. b*32+31 of the row at byte rbase (zeros past cols for the float formats).
void decode(uint rbase, uint b, out float v[QK]) {
  const uint e0 = b * QK;
#if WTYPE == 0
  [[unroll]] for (uint i = 0; i < QK; ++i) v[i] = e0 + i < p.cols ? uintBitsToFloat(w[(rbase >> 2) + e0 + i]) : 0.0;
#elif WTYPE == 1
  [[unroll]] for (uint i = 0; i < QK; ++i) v[i] = e0 + i < p.cols ? half_at(rbase + 2u * (e0 + i)) : 0.0;
#elif WTYPE == 2
  const uint blk = rbase + b * 18u;  // BlockQ4_0 {f16 d; u8 qs[16]}
  const float d = half_at(blk);
  [[unroll]] for (uint i = 0; i < QK / 2; ++i) {
    const uint q = byte_at(blk + 2u + i);
    v[i] = (float(q & 15u) - 8.0) * d;
    v[i + QK / 2] = (float(q >> 4) - 8.0) * d;
  }
#elif WTYPE == 3
  const uint blk = rbase + b * 20u;  // BlockQ4_1 {f16 d; f16 m; u8 qs[16]}
  const float d = half_at(blk);
  const float m = half_at(blk + 2u);
  [[unroll]] for (uint i = 0; i < QK / 2; ++i) {
    const uint q = byte_at(blk + 4u + i);
    v[i] = float(q & 15u) * d + m;
    v[i + QK / 2] = float(q >> 4) * d + m;
  }
#elif WTYPE == 8
  const uint blk = rbase + b * 34u;  // BlockQ8_0 {f16 d; i8 qs[32]}
  const float d = half_at(blk);
  [[unroll]] for (uint i = 0; i < QK; ++i) v[i] = float(int(byte_at(blk + 2u + i) << 24) >> 24) * d;
#else
#error "WTYPE must be 0, 1, 2, 3 or 8"
#endif
}

#if SUBGROUP
void main() {
  const uint g = gl_WorkGroupID.x + gl_WorkGroupID.z * gl_NumWorkGroups.x;
  const uint r_end = min(p.rows, (g + 1u) * p.rows_per_group);
  const uint t0 = gl_WorkGroupID.y * ROWS_PER_PASS;
  const uint nt = min(uint(ROWS_PER_PASS), p.T - t0);
  const uint nblk = (p.cols + QK - 1) / QK;
  // r is uniform over each subgroup, so every lane reaches subgroupAdd.
  for (uint r = g * p.rows_per_group + gl_SubgroupID; r < r_end; r += gl_NumSubgroups) {
    const uint rbase = r * p.row_bytes;
    float acc[ROWS_PER_PASS];
    [[unroll]] for (uint t = 0; t < ROWS_PER_PASS; ++t) acc[t] = 0.0;
    for (uint b = gl_SubgroupInvocationID; b < nblk; b += gl_SubgroupSize) {
      float v[QK];
      decode(rbase, b, v);
      const uint e0 = b * QK;
      const uint ne = min(uint(QK), p.cols - e0);
      [[unroll]] for (uint t = 0; t < ROWS_PER_PASS; ++t) {
        if (t < nt) {
          const uint xo = (t0 + t) * p.cols + e0;
          float s = 0.0;
          if (ne == QK) {  // whole block: constant indices keep v in registers
            [[unroll]] for (uint i = 0; i < QK; ++i) s += v[i] * x[xo + i];
          } else {
            for (uint i = 0; i < ne; ++i) s += v[i] * x[xo + i];
          }
          acc[t] += s;
        }
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
  const uint nblk = (p.cols + QK - 1) / QK;

  float acc[ROWS_PER_PASS];
  [[unroll]] for (uint t = 0; t < ROWS_PER_PASS; ++t) acc[t] = 0.0;
  for (uint b = lid; b < nblk; b += THREADS) {
    float v[QK];
    decode(rbase, b, v);
    const uint e0 = b * QK;
    const uint ne = min(uint(QK), p.cols - e0);
    for (uint t = 0; t < nt; ++t) {
      const uint xo = (t0 + t) * p.cols + e0;
      float s = 0.0;
      for (uint i = 0; i < ne; ++i) s += v[i] * x[xo + i];
      acc[t] += s;
    }
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
