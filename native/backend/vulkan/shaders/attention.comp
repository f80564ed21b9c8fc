// Flash-decode attention over paged KV: OUT (T, n_head, head_dim) = softmax(scale * Q K^T) V for one
// sequence, with one pass of online softmax over chunks of CHUNK positions. K and V formats are chosen
// at build time (KFMT, VFMT: KvFormat ids 0 f32, 1 f16, 2 q8_0, 3 q8_head, 4 q4_0; CMakeLists.txt
// builds every pair). One workgroup per (head, query row).
// KV pool layout (kv_cache.h): the row of (kv head h, slot j) of K in table block b starts at byte
//   blocks[b] * block_bytes + k_offset + (h * block_tokens + j) * k_row_bytes   (V alike).
#version 450

#define THREADS 64
#define CHUNK THREADS        // positions scored per step, one per thread
#define MAX_HEAD_DIM 256     // shared q and per-thread accumulators
#define DIMS_PER_THREAD (MAX_HEAD_DIM / THREADS)

layout(local_size_x = THREADS) in;
layout(std430, binding = 0) readonly buffer Qb { float q[]; };     // (T, n_head, head_dim)
layout(std430, binding = 1) readonly buffer Pool { uint kv[]; };   // raw pool bytes
layout(std430, binding = 2) readonly buffer Blocks { int blocks[]; };
layout(std430, binding = 3) writeonly buffer Ob { float o[]; };    // (T, n_head, head_dim)
layout(push_constant) uniform Params {
  uint T;
  uint n_head;
  uint n_head_kv;
  uint head_dim;
  uint block_tokens;
  uint n_past;
  float scale;
  uint block_bytes;
  uint k_offset;
  uint v_offset;
  uint k_row_bytes;
  uint v_row_bytes;
} p;

shared float qs[MAX_HEAD_DIM];
shared float sc[CHUNK];

uint byte_at(uint off) { return (kv[off >> 2] >> ((off & 3u) * 8u)) & 0xFFu; }
int sbyte_at(uint off) { return int(byte_at(off) << 24) >> 24; }
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
float half_at(uint off) { return h2f((kv[off >> 2] >> ((off & 2u) * 8u)) & 0xFFFFu); }
float f32_at(uint off) {
  const uint s = (off & 3u) * 8u;
  const uint lo = kv[off >> 2] >> s;
  return uintBitsToFloat(s == 0u ? lo : lo | (kv[(off >> 2) + 1u] << (32u - s)));
}

// Element e of the row at byte `row` in format f.
float load(uint f, uint row, uint e) {
  if (f == 0u) return f32_at(row + 4u * e);
  if (f == 1u) return half_at(row + 2u * e);
  if (f == 2u) {  // BlockQ8_0 {f16 d; i8 qs[32]} per 32 elements
    const uint blk = row + (e / 32u) * 34u;
    return half_at(blk) * float(sbyte_at(blk + 2u + e % 32u));
  }
  if (f == 3u) return f32_at(row) * float(sbyte_at(row + 4u + e));  // [f32 scale][i8 q[head_dim]]
  // BlockQ4_0 {f16 d; u8 qs[16]}: element i < 16 in the low nibble of byte i, 16 + i in its high nibble
  const uint blk = row + (e / 32u) * 18u;
  const uint i = e % 32u;
  const uint b = byte_at(blk + 2u + i % 16u);
  return half_at(blk) * (float(i < 16u ? b & 15u : b >> 4) - 8.0);
}

uint row_offset(uint pos, uint kvh, uint part_offset, uint row_bytes) {
  const uint blk = uint(blocks[pos / p.block_tokens]);
  return blk * p.block_bytes + part_offset + (kvh * p.block_tokens + pos % p.block_tokens) * row_bytes;
}

void main() {
  const uint h = gl_WorkGroupID.x;
  const uint t = gl_WorkGroupID.y;
  const uint lid = gl_LocalInvocationID.x;
  const uint kvh = h / (p.n_head / p.n_head_kv);
  const uint hd = p.head_dim;
  const uint qbase = (t * p.n_head + h) * hd;
  const uint visible = p.n_past - p.T + t + 1u;  // causal: positions 0 .. n_past - T + t

  for (uint d = lid; d < hd; d += THREADS) qs[d] = q[qbase + d] * p.scale;
  float acc[DIMS_PER_THREAD];
  for (uint k = 0; k < DIMS_PER_THREAD; ++k) acc[k] = 0.0;
  float m = -1.0 / 0.0;  // running max
  float l = 0.0;         // running sum of exp(score - m)
  barrier();

  for (uint c0 = 0; c0 < visible; c0 += CHUNK) {
    const uint pos = c0 + lid;
    float s = -1.0 / 0.0;
    if (pos < visible) {
      const uint row = row_offset(pos, kvh, p.k_offset, p.k_row_bytes);
      s = 0.0;
      for (uint d = 0; d < hd; ++d) s += qs[d] * load(KFMT, row, d);
    }
    sc[lid] = s;
    barrier();
    const uint n = min(uint(CHUNK), visible - c0);
    float mc = m;
    for (uint j = 0; j < n; ++j) mc = max(mc, sc[j]);
    const float corr = exp(m - mc);  // m = -inf on the first chunk: exp(-inf) = 0
    l *= corr;
    for (uint k = 0; k < DIMS_PER_THREAD; ++k) acc[k] *= corr;
    for (uint j = 0; j < n; ++j) {
      const float wj = exp(sc[j] - mc);
      l += wj;
      const uint row = row_offset(c0 + j, kvh, p.v_offset, p.v_row_bytes);
      for (uint k = 0; k < DIMS_PER_THREAD; ++k) {
        const uint d = lid + k * THREADS;
        if (d < hd) acc[k] += wj * load(VFMT, row, d);
      }
    }
    m = mc;
    barrier();  // sc is rewritten by the next chunk
  }
  for (uint k = 0; k < DIMS_PER_THREAD; ++k) {
    const uint d = lid + k * THREADS;
    if (d < hd) o[qbase + d] = acc[k] / l;
  }
}
