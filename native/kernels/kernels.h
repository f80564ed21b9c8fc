// Hot loops behind one table of function pointers, filled once per ISA level.
// kernels/ref.cpp is the scalar reference every other level is tested against;
// each ISA lives in its own file compiled with its own flags.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "../kv_format.h"
#include "../quant.h"

namespace kvs {

// Activations quantized once per matmul for integer dot products: 32 int8 with
// their scale d and d * sum(qs) (which the Q4_0 offset and the Q4_1 minimum need).
// Internal layout, never stored in a file.
struct BlockQ8A {
  float d;
  float ds;
  int8_t qs[kQK];
};
static_assert(sizeof(BlockQ8A) == 40, "BlockQ8A must be 40 bytes");

// Weight rows one dot_q_rows call serves, at most (the matmul's tile; AVX-512 serves 16 rows per register).
constexpr int kMaxRows = 16;
// Query heads of one GQA group served per K/V row read, at most.
constexpr int kMaxGroup = 16;
// Head dimension the attention kernels support, at most (stack buffers).
constexpr int kMaxHeadDim = 512;

// GELU's tanh approximation: 0.5 x (1 + tanh(kGeluSqrt2OverPi (x + kGeluCubic x^3))).
constexpr float kGeluSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;
// One element of it as the SIMD bodies compute it (their tails): x / (1 + exp(-2z)).
inline float gelu_tanh_one(float x) {
  const float z = kGeluSqrt2OverPi * x * (1.0f + kGeluCubic * x * x);
  return x / (1.0f + std::exp(-2.0f * z));
}

// Memory a kernel asks for (prefetcht1, into L2) while it computes: n runs of `bytes` bytes.
struct PrefetchRuns {
  const uint8_t* const* runs = nullptr;
  int n = 0;
  size_t bytes = 0;
};

struct Kernels {
  const char* name;  // "ref", "avx2", ...
  // a (n,) . b (n,) -> scalar
  float (*dot_f32)(const float* a, const float* b, int n);
  // y (n,) += alpha * x (n,)
  void (*axpy_f32)(float alpha, const float* x, float* y, int n);
  // One weight row of n elements (n a multiple of the type's block) -> dst (n,) floats.
  void (*dequant_row)(GgmlType type, const void* src, float* dst, int64_t n);
  // One KV row (head_dim elements in format f) -> dst (head_dim,) floats.
  void (*kv_load_row)(KvFormat f, const void* src, float* dst, int head_dim);

  // x (n,) -> out (n/32,) blocks; n a multiple of 32.
  void (*quantize_act)(const float* x, BlockQ8A* out, int64_t n);
  // One block-quantized weight row (n,) . quantized activations (n/32 blocks) -> scalar, for every
  // type_is_quantized() type. A 256-element super-block (K-quants, IQ4_XS) spans 8 activation blocks.
  float (*dot_q)(GgmlType type, const void* w, const BlockQ8A* a, int64_t n);
  // One weight row against T activation rows: out[t * out_stride] = w . a_t, where
  // a_t = a + t * a_stride blocks. Each weight block is decoded once for all T rows.
  void (*dot_q_batch)(GgmlType type, const void* w, const BlockQ8A* a, int64_t a_stride, int T, int64_t n, float* out,
                      int64_t out_stride);
  // One KV block of cnt positions for one kv head; row j lives at row0 + j * stride.
  // s (G, ld): s[g*ld + j] = q_g . k_j for the G query heads of the group.
  // q: (G, hd) floats (f32/f16 keys); qq: (G, hd/32) quantized copies (q8_0, q8_head, q4_0 keys).
  // For q8_head keys every block of one query head must share one scale
  // (quantize_head), so the integer dot runs over the whole head before scaling.
  void (*attn_scores)(KvFormat f, const uint8_t* row0, size_t stride, int cnt, const float* q, const BlockQ8A* qq,
                      int G, int hd, float* s, int ld);
  // acc (G, hd) += sum_j w[g*ld + j] * v_j over the cnt V rows of one block.
  void (*attn_accum)(KvFormat f, const uint8_t* row0, size_t stride, int cnt, const float* w, int ld, float* acc, int G,
                     int hd);
  // x[i] = exp(x[i] - mx) for i < n; returns their sum.
  float (*exp_sum)(float* x, int n, float mx);
  // SwiGLU: g[i] = silu(g[i]) * u[i] = g[i] / (1 + exp(-g[i])) * u[i].
  void (*silu_mul)(float* g, const float* u, int n);
  // GeGLU: g[i] = gelu(g[i]) * u[i], GELU by its tanh approximation 0.5 x (1 + tanh(z)),
  // z = sqrt(2/pi) (x + 0.044715 x^3). The SIMD bodies use the identity 0.5 (1 + tanh(z)) = 1 / (1 + exp(-2z)).
  void (*gelu_tanh_mul)(float* g, const float* u, int n);
  // R <= kMaxRows weight rows of one quantized type (row r at w[r], n elements each) against T activation rows:
  // out[r][t * out_stride] = w[r] . a_t, a_t = a + t * a_stride blocks. The matmul's one entry: each weight block
  // is decoded once for all T rows, and every (r, t) result is the same bits whatever R, T and the other rows
  // are; dot_q and dot_q_batch are its R = 1 case.
  void (*dot_q_rows)(GgmlType type, const void* const* w, int R, const BlockQ8A* a, int64_t a_stride, int T, int64_t n,
                     float* const* out, int64_t out_stride);
  // Scores of positions off .. off + cnt - 1 (off + cnt <= 16) of one q8_0 / q4_0 key tile (kv_format.h):
  // s[g*ld + j] = q_g . k_{off+j}, the same bits as attn_scores on those rows.
  void (*attn_scores_tile)(KvFormat f, const uint8_t* tile, int off, int cnt, const BlockQ8A* qq, int G, int hd,
                           float* s, int ld);
  // Whether this level has a tile body, so that CPU pools store q8_0 / q4_0 keys as tiles (the others
  // copy a tile's rows out and score them as rows).
  bool key_tiles;
  // The V sums of one attention task over q8_0 / q4_0 value tiles (kv_format.h), in integers. Row j
  // (0 <= j < n <= kValueTaskRows) of the task is row (first + j) % 16 of tiles[(first + j) / 16], with
  // weights w[g*ld + j]; d_jb is the f16 scale of its block b and q_jbx its int8 (q4_0: nibble - 8)
  // values. For each query head g and block b (value_tile_exponent, value_tile_weight below):
  //   e = value_tile_exponent(max_j |fl(w_gj d_jb)|), u_j = value_tile_weight(fl(w_gj d_jb) * 2^-e),
  //   acc[g*hd + 32b + x] += float(sum_j u_j q_jbx) * 2^e, the sum exact (|u| <= 2^22).
  // So each weight is rounded by 2^e / 2 at most, 2^-22 of the block's largest |w d| (a float V sum
  // rounds each of its terms by 2^-24 of the running sum), and the sum is rounded once. Every level
  // gives the same bits (ref.cpp is the arithmetic). Only a level with value_tiles true is handed tiles.
  // Meanwhile it asks for `ahead` (the next task's keys) into L2, its runs spread evenly over the call's
  // steps (each block of each tile), all of them whatever the call's length.
  void (*attn_accum_tiles)(KvFormat f, const uint8_t* const* tiles, int first, int n, const float* w, int ld,
                           float* acc, int G, int hd, const PrefetchRuns& ahead);
  // Whether this level has a value-tile body, so that CPU pools store q8_0 / q4_0 values as tiles.
  bool value_tiles;
  // n_tiles consecutive weight tiles (quant.h) of one matrix of a weight_tiles_type() type with rows of n elements
  // against T activation rows: out[16 i + r + t * out_stride] = (row r of tile i) . a_t, the same bits as dot_q_rows
  // on the rows.
  void (*dot_q_tiles)(GgmlType type, const uint8_t* tiles, int64_t n_tiles, const BlockQ8A* a, int64_t a_stride, int T,
                      int64_t n, float* out, int64_t out_stride);
  // The weight types this level has a tile body for (bit t for GgmlType t; tile_bit below), so that the CPU
  // backend packs those matrices as tiles and leaves the others in rows.
  uint64_t weight_tile_types;
};

// The weight_tile_types bit of a type.
constexpr uint64_t tile_bit(GgmlType t) {
  return uint64_t{1} << static_cast<uint32_t>(t);
}
// Whether level k serves matrices of this type as weight tiles.
inline bool has_weight_tiles(const Kernels& k, GgmlType t) {
  return static_cast<uint32_t>(t) < 64 && (k.weight_tile_types & tile_bit(t)) != 0;
}

// Rows one attn_accum_tiles call sums, at most (a SIMD body's 8-bit partial sums stay inside int32).
constexpr int kValueTaskRows = 1024;
// attn_accum_tiles' power of two for a block whose largest |w d| is m: m * 2^-e in [2^21, 2^22), the
// exponent clamped to [-100, 100] (0 and inf at the ends; m is never NaN).
inline int value_tile_exponent(float m) {
  if (!(m > 0.0f)) return -100;
  if (m > 3.4028235e38f) return 100;
  return std::clamp(std::ilogb(m) - 21, -100, 100);
}
// attn_accum_tiles' weight: x rounded to the nearest integer, ties to even (|x| <= 2^22 whenever the
// scales are finite). Beyond that (an infinite or NaN scale) the SIMD bodies' arithmetic: cvtps2dq
// (INT32_MIN when out of range) plus 2^22, kept to 24 bits (the three weight bytes), minus 2^22.
inline int32_t value_tile_weight(float x) {
  const float r = std::nearbyint(x);
  const int64_t i = r >= -2147483648.0f && r < 2147483648.0f ? static_cast<int64_t>(r) : INT32_MIN;
  return static_cast<int32_t>(((i + (int64_t{1} << 22)) & ((int64_t{1} << 24) - 1)) - (int64_t{1} << 22));
}
// The reference body of attn_accum_tiles (the levels without their own point their table to it).
void attn_accum_tiles_ref(KvFormat f, const uint8_t* const* tiles, int first, int n, const float* w, int ld, float* acc,
                          int G, int hd, const PrefetchRuns& ahead);

// (kMaxGroup, kMaxHeadDim) zero floats: the float queries a q8_0 / q4_0 score call does not read.
const float* zero_queries();

// attn_scores_tile for a level without a tile body: the rows copied out of the tile, then its row body.
template <auto Scores>
void attn_scores_tile_rows(KvFormat f, const uint8_t* tile, int off, int cnt, const BlockQ8A* qq, int G, int hd,
                           float* s, int ld) {
  uint8_t rows[kKeyTileRows * (kMaxHeadDim / kQK) * sizeof(BlockQ8_0)];
  const size_t rb = kv_row_bytes(f, hd);
  for (int j = 0; j < cnt; ++j) kv_tile_get_row(f, KvTile::Keys, tile, off + j, rows + j * rb, hd);
  Scores(f, rows, rb, cnt, zero_queries(), qq, G, hd, s, ld);
}

// dot_q_tiles for a level without a tile body: each tile's rows copied out, then its row body.
template <auto Rows>
void dot_q_tiles_rows(GgmlType type, const uint8_t* tiles, int64_t n_tiles, const BlockQ8A* a, int64_t a_stride, int T,
                      int64_t n, float* out, int64_t out_stride) {
  const size_t rb = row_bytes(type, n), tile = kWeightTileRows * rb;
  std::vector<uint8_t> rows(tile);
  const void* w[kWeightTileRows];
  float* outs[kWeightTileRows];
  for (int64_t i = 0; i < n_tiles; ++i) {
    for (int r = 0; r < kWeightTileRows; ++r) {
      weight_tile_get_row(type, tiles + i * tile, r, rows.data() + r * rb, n);
      w[r] = rows.data() + r * rb;
      outs[r] = out + kWeightTileRows * i + r;
    }
    Rows(type, w, kWeightTileRows, a, a_stride, T, n, outs, out_stride);
  }
}

// x (n,) -> n/32 blocks that all share one scale max|x|/127 (queries for q8_head keys).
void quantize_head(const float* x, BlockQ8A* out, int n);

// Scalar reference table; always available.
const Kernels& kernels_ref();
#if defined(KVS_HAVE_X86)
const Kernels& kernels_avx2();
const Kernels& kernels_avx512();
const Kernels& kernels_avx512_amx();
#endif
#if defined(KVS_HAVE_NEON)
const Kernels& kernels_neon();
const Kernels& kernels_neon_dotprod();
#endif

// Levels this machine can run, best last (e.g. {"ref", "avx2"}).
std::vector<std::string> available_isa_levels();
// The table for a level; throws std::invalid_argument for a level this machine lacks.
const Kernels& kernels_for(const std::string& level);
// The active table: best available level, or the one named by $KVSWARM_ISA.
const Kernels& active_kernels();

}  // namespace kvs
