// Stores SRC (T, n_kv_head, head_dim) f32 into the paged KV pool as rows of one KvFormat (fmt: 0 f32,
// 1 f16, 2 q8_0, 3 q8_head, 4 q4_0), with kv_format.cpp's encoding (round-to-nearest-even halves and
// quants). Row t's position p and its table's first entry come from ROWS (T, 2); its block is
// tables[first + p / block_tokens]. The row of (t, kv head h) starts at byte
//   block * block_bytes + part_offset + (h * block_tokens + p % block_tokens) * row_bytes.
// One invocation per 32-element chunk of a row (per row for q8_head, whose one scale spans it). Rows need
// not start on a 32-bit word, so bytes are written with atomicAnd/atomicOr: each byte has one writer.
#version 450

#define THREADS 64
#define QK 32

layout(local_size_x = THREADS) in;
layout(std430, binding = 0) readonly buffer Sb { float src[]; };  // (T, n_kv_head, head_dim)
layout(std430, binding = 1) buffer Pool { uint kv[]; };           // raw pool bytes
layout(std430, binding = 2) readonly buffer Tb { int tables[]; };
layout(std430, binding = 3) readonly buffer Rb { int rows[]; };  // (T, 2) {position, first table entry}
layout(push_constant) uniform Params {
  uint T;
  uint n_kv_head;
  uint head_dim;
  uint block_tokens;
  uint block_bytes;
  uint part_offset;
  uint row_bytes;
  uint fmt;
  uint n_blocks;  // blocks in the pool: a table entry outside [0, n_blocks) is never written
} p;

void put_byte(uint off, uint v) {
  const uint sh = (off & 3u) * 8u;
  atomicAnd(kv[off >> 2], ~(0xFFu << sh));
  atomicOr(kv[off >> 2], (v & 0xFFu) << sh);
}
void put_u16(uint off, uint v) {
  put_byte(off, v);
  put_byte(off + 1u, v >> 8);
}
void put_u32(uint off, uint v) {
  if ((off & 3u) == 0u) {
    kv[off >> 2] = v;  // the whole word is this invocation's
  } else {
    put_u16(off, v);
    put_u16(off + 2u, v >> 16);
  }
}

// a / b rounded to nearest, as the CPU divides (Vulkan lets a plain `/` err by 2.5 ulp, and a scale
// one ulp off moves quants across a rounding boundary): one correction step on the residual.
float div_rn(float a, float b) {
  precise float q = a / b;
  precise float r = fma(-q, b, a);
  precise float c = fma(r, 1.0 / b, q);
  return c;
}

// IEEE half of f, round to nearest even (kvs::fp32_to_fp16).
uint f2h(float f) {
  const uint x = floatBitsToUint(f);
  const uint sign = (x >> 16) & 0x8000u;
  const uint ax = x & 0x7FFFFFFFu;
  if (ax >= 0x7F800000u) return sign | (ax > 0x7F800000u ? 0x7E00u : 0x7C00u);  // NaN, inf
  if (ax >= 0x477FF000u) return sign | 0x7C00u;  // rounds past 65504
  if (ax < 0x38800000u) {                        // below 2^-14: a subnormal half (or zero)
    return sign | uint(roundEven(uintBitsToFloat(ax) * 16777216.0));  // units of 2^-24, exact scaling
  }
  uint h = (((ax >> 23) - 112u) << 10) | ((ax & 0x7FFFFFu) >> 13);
  const uint rem = ax & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) != 0u)) h += 1u;
  return sign | h;
}

void main() {
  const uint chunks = p.fmt == 3u ? 1u : (p.head_dim + QK - 1u) / QK;
  const uint id = gl_GlobalInvocationID.x;
  if (id >= p.T * p.n_kv_head * chunks) return;
  const uint c = id % chunks;
  const uint h = (id / chunks) % p.n_kv_head;
  const uint t = id / (chunks * p.n_kv_head);
  const int pos = rows[2u * t];
  const int blk = tables[rows[2u * t + 1u] + pos / int(p.block_tokens)];
  if (pos < 0 || blk < 0 || uint(blk) >= p.n_blocks) return;
  const uint row = uint(blk) * p.block_bytes + p.part_offset +
                   (h * p.block_tokens + uint(pos) % p.block_tokens) * p.row_bytes;
  const uint x0 = (t * p.n_kv_head + h) * p.head_dim;  // the row in src
  const uint e0 = c * QK;
  const uint ne = min(uint(QK), p.head_dim - e0);
  if (p.fmt == 0u) {
    for (uint i = 0; i < ne; ++i) put_u32(row + 4u * (e0 + i), floatBitsToUint(src[x0 + e0 + i]));
  } else if (p.fmt == 1u) {
    for (uint i = 0; i < ne; ++i) put_u16(row + 2u * (e0 + i), f2h(src[x0 + e0 + i]));
  } else if (p.fmt == 2u) {  // BlockQ8_0 {f16 d; i8 qs[32]}: d = amax / 127
    float amax = 0.0;
    for (uint i = 0; i < QK; ++i) amax = max(amax, abs(src[x0 + e0 + i]));
    const float d = div_rn(amax, 127.0);
    const float id = d != 0.0 ? div_rn(1.0, d) : 0.0;
    const uint blk_off = row + c * 34u;
    put_u16(blk_off, f2h(d));
    for (uint i = 0; i < QK; ++i) {
      precise float v = src[x0 + e0 + i] * id;
      put_byte(blk_off + 2u + i, uint(int(roundEven(v))));
    }
  } else if (p.fmt == 3u) {  // [f32 scale][i8 q[head_dim]]: scale = amax / 127 over the row
    float amax = 0.0;
    for (uint i = 0; i < p.head_dim; ++i) amax = max(amax, abs(src[x0 + i]));
    const float s = div_rn(amax, 127.0);
    const float is = s != 0.0 ? div_rn(1.0, s) : 0.0;
    put_u32(row, floatBitsToUint(s));
    for (uint i = 0; i < p.head_dim; ++i) {
      precise float v = src[x0 + i] * is;
      put_byte(row + 4u + i, uint(int(roundEven(v))));
    }
  } else {  // BlockQ4_0 {f16 d; u8 qs[16]}: the signed value of largest magnitude maps to -8
    float amax = 0.0;
    float vmax = 0.0;
    for (uint i = 0; i < QK; ++i) {
      const float v = src[x0 + e0 + i];
      if (abs(v) > amax) {
        amax = abs(v);
        vmax = v;
      }
    }
    const float d = vmax * -0.125;  // vmax / -8, exact
    const float id = d != 0.0 ? div_rn(1.0, d) : 0.0;
    const uint blk_off = row + c * 18u;
    put_u16(blk_off, f2h(d));
    for (uint i = 0; i < QK / 2; ++i) {
      precise float a = src[x0 + e0 + i] * id;  // no fused multiply-add: the CPU rounds the product
      precise float b = src[x0 + e0 + i + QK / 2] * id;
      a += 8.5;
      b += 8.5;
      const uint lo = uint(min(15, int(a)));
      const uint hi = uint(min(15, int(b)));
      put_byte(blk_off + 2u + i, lo | (hi << 4));
    }
  }
}
