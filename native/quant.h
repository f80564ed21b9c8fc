// Block formats shared by weights and the KV cache: ggml-compatible byte
// layouts, half/bfloat conversion, and the per-row (de)quantizers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace kvs {

// GGUF tensor type ids (the subset we read). Values are fixed by the format.
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  IQ4_NL = 20,
  IQ4_XS = 23,
  BF16 = 30,
};

constexpr int kQK = 32;  // elements per quantized block (ggml QK4_0/QK4_1/QK8_0)

// d: f16 scale; value = (nibble - 8) * d. Low nibbles hold elements 0..15,
// high nibbles elements 16..31.
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ4_0) == 18, "BlockQ4_0 must be 18 bytes (ggml layout)");

// d, m: f16 scale and min; value = nibble * d + m. Nibble order as Q4_0.
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ4_1) == 20, "BlockQ4_1 must be 20 bytes (ggml layout)");

// d: f16 scale; value = q * d.
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};
static_assert(sizeof(BlockQ8_0) == 34, "BlockQ8_0 must be 34 bytes (ggml layout)");

// d: f16 scale; q = nibble | (bit j of qh) << 4 for element j, value = (q - 16) * d.
// Nibble order as Q4_0; qh is a little-endian 32-bit mask, bit j for element j.
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ5_0) == 22, "BlockQ5_0 must be 22 bytes (ggml layout)");

// d, m: f16 scale and min; value = q * d + m with q built as in Q5_0.
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ5_1) == 24, "BlockQ5_1 must be 24 bytes (ggml layout)");

// The 16 signed levels of the non-linear 4-bit formats (IQ4_NL, IQ4_XS): value = d * kIq4Levels[nibble].
// Fixed by the format (gguf-py IQ4_NL.kvalues).
constexpr int8_t kIq4Levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// d: f16 scale; value = d * kIq4Levels[nibble], nibble order as Q4_0.
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockIQ4_NL) == 18, "BlockIQ4_NL must be 18 bytes (ggml layout)");

// ---- K-quants: 256-element super-blocks (8 activation blocks of 32). ----
constexpr int kQKK = 256;  // elements per super-block (ggml QK_K)

// 16 sub-blocks of 16. scales[s]: low nibble = scale, high nibble = min of sub-block s.
// Element e = 128h + 32j + l (h < 2, j < 4, l < 32): q = (qs[32h + l] >> 2j) & 3, s = e / 16,
// value = d * (scales[s] & 15) * q - dmin * (scales[s] >> 4).
struct BlockQ2_K {
  uint8_t scales[kQKK / 16];
  uint8_t qs[kQKK / 4];
  uint16_t d;
  uint16_t dmin;
};
static_assert(sizeof(BlockQ2_K) == 84, "BlockQ2_K must be 84 bytes (ggml layout)");

// 16 sub-blocks of 16 with signed 6-bit scales packed in 12 bytes: scale s has low 4 bits
// (scales[s % 8] >> 4 * (s / 8)) & 15 and high 2 bits (scales[8 + s % 4] >> 2 * (s / 4)) & 3; minus 32.
// Element e = 128h + 32j + l: low 2 bits (qs[32h + l] >> 2j) & 3; high bit (hmask[e % 32] >> e / 32) & 1;
// q = low - (high ? 0 : 4), value = d * (scale - 32) * q.
struct BlockQ3_K {
  uint8_t hmask[kQKK / 8];
  uint8_t qs[kQKK / 4];
  uint8_t scales[12];
  uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110, "BlockQ3_K must be 110 bytes (ggml layout)");

// 8 sub-blocks of 32 with unsigned 6-bit scales and mins packed in 12 bytes (see k_scale_min).
// Element e = 64c + 32k + l (c < 4, k < 2): q = (qs[32c + l] >> 4k) & 15, sub-block e / 32,
// value = d * scale * q - dmin * min.
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[kQKK / 2];
};
static_assert(sizeof(BlockQ4_K) == 144, "BlockQ4_K must be 144 bytes (ggml layout)");

// As Q4_K with a fifth bit: q |= ((qh[e % 32] >> e / 32) & 1) << 4.
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[kQKK / 8];
  uint8_t qs[kQKK / 2];
};
static_assert(sizeof(BlockQ5_K) == 176, "BlockQ5_K must be 176 bytes (ggml layout)");

// 16 sub-blocks of 16 with int8 scales. Element e = 128h + r (r < 128):
// low 4 bits (ql[64h + r % 64] >> 4 * (r / 64)) & 15, high 2 bits (qh[32h + r % 32] >> 2 * (r / 32)) & 3,
// value = d * scales[e / 16] * (q - 32).
struct BlockQ6_K {
  uint8_t ql[kQKK / 2];
  uint8_t qh[kQKK / 4];
  int8_t scales[kQKK / 16];
  uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210, "BlockQ6_K must be 210 bytes (ggml layout)");

// 8 sub-blocks of 32. Sub-block b has the signed 6-bit scale
// ((scales_l[b / 2] >> 4 * (b % 2)) & 15 | ((scales_h >> 2b) & 3) << 4) - 32 and the nibbles
// qs[16b .. 16b + 16) in Q4_0 order; value = d * scale * kIq4Levels[nibble].
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[kQKK / 64];
  uint8_t qs[kQKK / 2];
};
static_assert(sizeof(BlockIQ4_XS) == 136, "BlockIQ4_XS must be 136 bytes (ggml layout)");

// Scale and min (6 bits each) of sub-block j < 8 of a Q4_K / Q5_K super-block: bytes 0-3 hold the
// scales of 0-3 (low 6 bits), bytes 4-7 their mins; bytes 8-11 hold the low 4 bits of 4-7's scale
// (low nibble) and min (high nibble), whose top 2 bits sit in the top bits of bytes 0-3 / 4-7.
inline void k_scale_min(const uint8_t* s, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = s[j] & 63;
    *min = s[j + 4] & 63;
  } else {
    *scale = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    *min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// All 8 scales and mins of a Q4_K / Q5_K super-block at once (same packing as k_scale_min),
// four lanes per 32-bit word: sc = bytes of {sc0..3, sc4..7}, mn likewise.
inline void k_scales_mins(const uint8_t* s, uint8_t sc[8], uint8_t mn[8]) {
  uint32_t w[3];
  std::memcpy(w, s, 12);
  const uint32_t lo6 = 0x3f3f3f3fu, lo4 = 0x0f0f0f0fu, top2 = 0x30303030u;
  const uint32_t out[4] = {w[0] & lo6, (w[2] & lo4) | ((w[0] >> 2) & top2), w[1] & lo6,
                           ((w[2] >> 4) & lo4) | ((w[1] >> 2) & top2)};
  std::memcpy(sc, out, 8);
  std::memcpy(mn, out + 2, 8);
}

// Signed scale of sub-block s < 16 of a Q3_K super-block (range -32..31).
inline int q3k_scale(const uint8_t* sc, int s) {
  const int lo = (sc[s % 8] >> (4 * (s / 8))) & 15;
  const int hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
  return (lo | hi << 4) - 32;
}

// IEEE half <-> float, exact for every finite half; round-to-nearest-even.
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
inline float bf16_to_fp32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Elements per block and bytes per block of a tensor type.
struct TypeTraits {
  const char* name;
  int block_elems;
  int block_bytes;
};
// Throws std::invalid_argument for a type id we do not support.
TypeTraits type_traits(uint32_t type);
bool type_supported(uint32_t type);
// True for the block formats that take the integer dot path (dot_q) against quantized activations.
bool type_is_quantized(GgmlType type);
// "unsupported tensor type Q1_0 in <where> (supported: ...); re-quantize to one of them"
// ("... tensor type id 99 in ..." for an id GGML does not define).
std::string unsupported_type_message(uint32_t type, const std::string& where);
// "F32, F16, ..." : the types this engine reads, for error messages.
const char* supported_type_list();
// The type named `name` ("Q4_K", ...); throws std::invalid_argument naming the supported ones.
GgmlType type_from_name(const std::string& name);
// Bytes of one row of n elements; n must be a multiple of the block size.
size_t row_bytes(GgmlType type, int64_t n);

// Weight tiles: where the kernels serve weight rows 16 at a time (Kernels::weight_tiles), the CPU
// backend rewrites each 16 consecutive rows of a Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K or Q6_K matrix in place
// as one tile: the same bytes permuted as a key tile (kv_format.h), so that each 64-byte line is one
// 4-byte group of all 16 rows (one vector register, lane r = row r) and the 16 rows stream as one
// sequence, with no transpose and no scale gather. With nb blocks a row (cols / 32; cols / 256 for the
// K-quants), a tile of 16 * row_bytes bytes is
//   [block b][row r]: the f16 scale d of row r's block b, 2 bytes at 2 (16 b + r)        (32 nb bytes)
//   Q4_1 (Q4_K, Q5_K) only, [block b][row r]: the f16 minimum m (dmin), at 32 nb + 2 (16 b + r) (32 nb)
//   then [block b][group k][row r]: bytes qs[4k .. 4k + 3] of row r's block b, 4 bytes at
//   S + 64 (G b + k) + 4 r, S the scales' bytes above, G = 8 groups (Q8_0) or 4 (the packed nibbles);
//   Q5_0's 4 high-bit bytes qh are its group 0 and its nibbles groups 1..4 (G = 5): each 4 bytes after
//   the scale are one group, in the block's own order. Q4_K is laid out as Q4_1 with its 144-byte
//   super-block as the block (nb = cols / 256): d, then dmin where Q4_1 has m, then G = 35 groups (the
//   12 bytes of packed scales and mins, then the 128 bytes of nibbles); Q5_K likewise with its 176 bytes,
//   G = 43 (the 12 scale bytes, the 32 high-bit bytes qh, the 128 nibble bytes). Q6_K's 210-byte super-block is
//   a block whose d sits last: the scale area holds it, and its other 208 bytes (ql, qh, scales, in
//   order) are G = 52 groups.
// Readers that want one row (the token embedding, a float path) take it with weight_tile_get_row.
constexpr int kWeightTileRows = 16;
// Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K: the types that have a tile layout.
bool weight_tiles_type(GgmlType type);
// Row r (0..15) of a tile of rows of n elements <-> that row in row_bytes(type, n) layout.
void weight_tile_put_row(GgmlType type, const void* row, uint8_t* tile, int r, int64_t n);
void weight_tile_get_row(GgmlType type, const uint8_t* tile, int r, void* row, int64_t n);
// In place: `rows` (a multiple of 16) rows of n elements at data -> rows / 16 consecutive tiles.
void pack_weight_tiles(GgmlType type, uint8_t* data, int64_t rows, int64_t n);

}  // namespace kvs
