// Flash-decode attention over paged KV for a batch of rows of many sequences (the forward's op):
// OUT (T, n_head, head_dim) = softmax(scale * Q K^T) V, row t over positions [lo_t, p_t] of its own block
// table (ROWS (T, 2) = {p_t, first entry of its table in TABLES}; lo_t = 0, or p_t + 1 - window clipped at
// 0 on a sliding-window layer), with one pass of online softmax over chunks of CHUNK positions. K and V formats are chosen
// at build time (KFMT, VFMT: KvFormat ids 0 f32, 1 f16, 2 q8_0, 3 q8_head, 4 q4_0; CMakeLists.txt
// builds every pair). One workgroup per (head, query row).
// KV pool layout (kv_cache.h): the row of (kv head h, slot j) of K in table block b starts at byte
//   blocks[b] * block_bytes + k_offset + (h * block_tokens + j) * k_row_bytes   (V alike).
// INTDOT=1 (built for the 8-bit keys q8_0, q8_head, q4_0; picked where shaderIntegerDotProduct is enabled)
// scores as the CPU engine does (model.cpp, kernels/ref.cpp's attn_scores): the scaled query is quantized
// to 8 bits, per 32 elements (quantize_act) or with one scale over the head for q8_head keys
// (quantize_head), and each score is a sum of packed 4x8-bit integer dots times the scales, in the CPU's
// order of float operations.
#version 450
#ifndef INTDOT
#define INTDOT 0
#endif
#if INTDOT
#extension GL_EXT_spirv_intrinsics : require
// OpSDot (4450), PackedVectorFormat4x8Bit: capabilities DotProductInput4x8BitPacked (6019), DotProduct (6018).
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot4x8(uint a, uint b, spirv_literal int packed_format);
#endif

#define THREADS 64
#define CHUNK THREADS        // positions scored per step, one per thread
#define MAX_HEAD_DIM 256     // shared q and per-thread accumulators
#define DIMS_PER_THREAD (MAX_HEAD_DIM / THREADS)

layout(local_size_x = THREADS) in;
layout(std430, binding = 0) readonly buffer Qb { float q[]; };     // (T, n_head, head_dim)
layout(std430, binding = 1) readonly buffer Pool { uint kv[]; };   // raw pool bytes
layout(std430, binding = 2) readonly buffer Tables { int tables[]; };
layout(std430, binding = 3) readonly buffer Rows { int rows[]; };  // (T, 2) {position, first table entry}
layout(std430, binding = 4) writeonly buffer Ob { float o[]; };    // (T, n_head, head_dim)
layout(push_constant) uniform Params {
  uint T;
  uint n_head;
  uint n_head_kv;
  uint head_dim;
  uint block_tokens;
  uint window;  // 0: every position up to the row's
  float scale;
  uint block_bytes;
  uint k_offset;
  uint v_offset;
  uint k_row_bytes;
  uint v_row_bytes;
  uint n_blocks;  // blocks in the pool: a position whose table entry lies outside is skipped
} p;

shared float qs[MAX_HEAD_DIM];
shared float sc[CHUNK];
#if INTDOT
#define MAX_QBLOCKS (MAX_HEAD_DIM / 32)
shared uint qw[MAX_HEAD_DIM / 4];  // the quantized query: element 4k + j in byte j of word k
shared float qd[MAX_QBLOCKS];      // per 32-element block: its scale d
shared float qds[MAX_QBLOCKS];     // ... and d * sum(q)
shared float qamax[MAX_QBLOCKS];   // per block: max |q * scale| (q8_head takes the max of these)

// a / b rounded to nearest, as the CPU divides (kv_store.comp's div_rn).
float div_rn(float a, float b) {
  precise float q = a / b;
  precise float r = fma(-q, b, a);
  precise float c = fma(r, 1.0 / b, q);
  return c;
}
#endif

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

#if INTDOT
// The 4 bytes at off (any alignment).
uint word_at(uint off) {
  const uint i = off >> 2;
  const uint sh = (off & 3u) * 8u;
  return sh == 0u ? kv[i] : (kv[i] >> sh) | (kv[i + 1u] << (32u - sh));
}

// q . k for the K row at byte `row` against the quantized query (qw, qd, qds), as kernels/ref.cpp's
// score_row: q8_0 and q4_0 as dot_q (per block acc = fma(s, d_k d_q, acc), q4_0 then fma(-8 d_k, ds_q,
// acc)); q8_head sums d_q * s over blocks and scales the sum once.
float int_score(uint row, uint nb) {
  float acc = 0.0;
  for (uint b = 0; b < nb; ++b) {
    int s = 0;
    if (KFMT == 2u) {  // BlockQ8_0 {f16 d; i8 qs[32]}
      const uint blk = row + b * 34u;
      for (uint k = 0; k < 8u; ++k) s += sdot4x8(word_at(blk + 2u + 4u * k), qw[8u * b + k], 0);
      precise float dd = half_at(blk) * qd[b];
      precise float v = fma(float(s), dd, acc);
      acc = v;
    } else if (KFMT == 4u) {  // BlockQ4_0 {f16 d; u8 qs[16]}: element i low nibble of byte i, 16 + i high
      const uint blk = row + b * 18u;
      for (uint k = 0; k < 4u; ++k) {
        const uint v = word_at(blk + 2u + 4u * k);
        s += sdot4x8(v & 0x0F0F0F0Fu, qw[8u * b + k], 0);
        s += sdot4x8((v >> 4) & 0x0F0F0F0Fu, qw[8u * b + 4u + k], 0);
      }
      const float d = half_at(blk);
      precise float dd = d * qd[b];
      precise float v = fma(float(s), dd, acc);
      v = fma(-8.0 * d, qds[b], v);
      acc = v;
    } else {  // q8_head: [f32 scale][i8 q[head_dim]]
      for (uint k = 0; k < 8u; ++k) s += sdot4x8(word_at(row + 4u + 32u * b + 4u * k), qw[8u * b + k], 0);
      precise float v = acc + qd[b] * float(s);
      acc = v;
    }
  }
  if (KFMT == 3u) {
    precise float v = f32_at(row) * acc;
    return v;
  }
  return acc;
}
#endif

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

uint table0;  // this row's first table entry

// The pool block of a position (p.n_blocks when the table entry lies outside the pool).
uint block_of(uint pos) {
  const int blk = tables[table0 + pos / p.block_tokens];
  return blk < 0 || uint(blk) >= p.n_blocks ? p.n_blocks : uint(blk);
}

uint row_offset(uint blk, uint pos, uint kvh, uint part_offset, uint row_bytes) {
  return blk * p.block_bytes + part_offset + (kvh * p.block_tokens + pos % p.block_tokens) * row_bytes;
}

void main() {
  const uint h = gl_WorkGroupID.x;
  const uint t = gl_WorkGroupID.y;
  const uint lid = gl_LocalInvocationID.x;
  const uint kvh = h / (p.n_head / p.n_head_kv);
  const uint hd = p.head_dim;
  const uint qbase = (t * p.n_head + h) * hd;
  const uint last = uint(rows[2u * t]);  // causal: positions lo .. last
  table0 = uint(rows[2u * t + 1u]);
  const uint lo = p.window > 0u && last + 1u > p.window ? last + 1u - p.window : 0u;

  for (uint d = lid; d < hd; d += THREADS) qs[d] = q[qbase + d] * p.scale;
#if INTDOT
  // The scaled query quantized as the CPU engine does (head_dim a multiple of 32: the backend checks).
  const uint nb = hd / 32u;
  barrier();
  if (lid < nb) {
    float amax = 0.0;
    for (uint i = 0; i < 32u; ++i) amax = max(amax, abs(qs[32u * lid + i]));
    qamax[lid] = amax;
  }
  barrier();
  if (lid < nb) {
    float amax = qamax[lid];
    if (KFMT == 3u) {  // quantize_head: one scale over the whole head
      for (uint b = 0; b < nb; ++b) amax = max(amax, qamax[b]);
    }
    const float d = div_rn(amax, 127.0);
    const float id = d != 0.0 ? div_rn(1.0, d) : 0.0;
    int sum = 0;
    for (uint k = 0; k < 8u; ++k) {
      uint word = 0u;
      for (uint j = 0; j < 4u; ++j) {
        precise float v = qs[32u * lid + 4u * k + j] * id;
        const int qi = int(roundEven(v));
        sum += qi;
        word |= (uint(qi) & 0xFFu) << (8u * j);
      }
      qw[8u * lid + k] = word;
    }
    qd[lid] = d;
    precise float ds = d * float(sum);
    qds[lid] = ds;
  }
#endif
  float acc[DIMS_PER_THREAD];
  for (uint k = 0; k < DIMS_PER_THREAD; ++k) acc[k] = 0.0;
  float m = -1.0 / 0.0;  // running max
  float l = 0.0;         // running sum of exp(score - m)
  barrier();

  for (uint c0 = lo; c0 <= last; c0 += CHUNK) {
    const uint pos = c0 + lid;
    float s = -1.0 / 0.0;
    if (pos <= last) {
      const uint blk = block_of(pos);
      if (blk < p.n_blocks) {
        const uint row = row_offset(blk, pos, kvh, p.k_offset, p.k_row_bytes);
#if INTDOT
        s = int_score(row, nb);
#else
        s = 0.0;
        for (uint d = 0; d < hd; ++d) s += qs[d] * load(KFMT, row, d);
#endif
      }
    }
    sc[lid] = s;
    barrier();
    const uint n = min(uint(CHUNK), last + 1u - c0);
    float mc = m;
    for (uint j = 0; j < n; ++j) mc = max(mc, sc[j]);
    const float corr = exp(m - mc);  // m = -inf on the first chunk: exp(-inf) = 0
    l *= corr;
    for (uint k = 0; k < DIMS_PER_THREAD; ++k) acc[k] *= corr;
    for (uint j = 0; j < n; ++j) {
      const uint blk = block_of(c0 + j);
      if (blk >= p.n_blocks) continue;  // a skipped position (score -inf): weight 0
      const float wj = exp(sc[j] - mc);
      l += wj;
      const uint row = row_offset(blk, c0 + j, kvh, p.v_offset, p.v_row_bytes);
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
    if (d < hd) o[qbase + d] = l > 0.0 ? acc[k] / l : 0.0;
  }
}
