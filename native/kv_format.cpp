#include "kv_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "quant.h"

namespace kvs {

KvFormat kv_format_from_string(const std::string& name) {
  if (name == "f32") return KvFormat::F32;
  if (name == "f16") return KvFormat::F16;
  if (name == "q8_0") return KvFormat::Q8_0;
  if (name == "q8_head") return KvFormat::Q8_HEAD;
  if (name == "q4_0") return KvFormat::Q4_0;
  throw std::invalid_argument("unknown KV format '" + name + "': expected one of f32, f16, q8_0, q8_head, q4_0");
}

const char* kv_format_name(KvFormat f) {
  switch (f) {
    case KvFormat::F32:
      return "f32";
    case KvFormat::F16:
      return "f16";
    case KvFormat::Q8_0:
      return "q8_0";
    case KvFormat::Q8_HEAD:
      return "q8_head";
    case KvFormat::Q4_0:
      return "q4_0";
  }
  return "?";
}

size_t kv_row_bytes(KvFormat f, int head_dim) {
  if (head_dim <= 0) throw std::invalid_argument("kv_row_bytes: head_dim must be positive");
  // Integer formats are scored with int8 dot products over blocks of 32.
  const bool blocked = f == KvFormat::Q8_0 || f == KvFormat::Q4_0 || f == KvFormat::Q8_HEAD;
  if (blocked && head_dim % kQK != 0) {
    throw std::invalid_argument(std::string("KV format ") + kv_format_name(f) +
                                " needs head_dim to be a multiple of 32, got " + std::to_string(head_dim) +
                                "; use f16 or f32");
  }
  const size_t n = static_cast<size_t>(head_dim);
  switch (f) {
    case KvFormat::F32:
      return 4 * n;
    case KvFormat::F16:
      return 2 * n;
    case KvFormat::Q8_0:
      return n / kQK * sizeof(BlockQ8_0);
    case KvFormat::Q8_HEAD:
      return sizeof(float) + n;
    case KvFormat::Q4_0:
      return n / kQK * sizeof(BlockQ4_0);
  }
  throw std::invalid_argument("kv_row_bytes: bad format");
}

// Every step writes its K/V rows through these, so they inline what libm calls would do per value:
// fmax and nearbyint were two calls per value on the portable baseline (no SSE4.1 round). The file is
// built with -ffp-contract=off (CMakeLists.txt), so no compiler fuses a product into an addition and the
// bytes are the same on every machine.

// The largest |x_i| (a NaN never replaces it, as fmax).
static float abs_max(const float* x, int n) {
  float m = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    m = a > m ? a : m;
  }
  return m;
}

// nearbyint(v) in the default rounding mode (to nearest, ties to even) for |v| <= 2^22: adding 1.5 * 2^23
// leaves no fraction bits, so the addition rounds v to an integer and the subtraction is exact.
static float round_even(float v) {
  constexpr float kShift = 12582912.0f;  // 1.5 * 2^23
  return (v + kShift) - kShift;
}

static void store_q8_0(const float* x, BlockQ8_0* out, int n) {
  for (int b = 0; b < n / kQK; ++b) {
    const float* xb = x + b * kQK;
    const float d = abs_max(xb, kQK) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].d = fp32_to_fp16(d);
    // |x id| <= 127 (plus rounding): inside round_even's range.
    for (int i = 0; i < kQK; ++i) out[b].qs[i] = static_cast<int8_t>(round_even(xb[i] * id));
  }
}

static void store_q4_0(const float* x, BlockQ4_0* out, int n) {
  for (int b = 0; b < n / kQK; ++b) {
    const float* xb = x + b * kQK;
    // Signed value of largest magnitude maps to -8, so the grid spans [-8d, 7d].
    float amax = 0.0f, vmax = 0.0f;
    for (int i = 0; i < kQK; ++i) {
      if (std::fabs(xb[i]) > amax) {
        amax = std::fabs(xb[i]);
        vmax = xb[i];
      }
    }
    const float d = vmax / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].d = fp32_to_fp16(d);
    for (int i = 0; i < kQK / 2; ++i) {
      const int lo = std::min(15, static_cast<int>(xb[i] * id + 8.5f));
      const int hi = std::min(15, static_cast<int>(xb[i + kQK / 2] * id + 8.5f));
      out[b].qs[i] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

static void store_q8_head(const float* x, uint8_t* out, int n) {
  const float s = abs_max(x, n) / 127.0f;
  const float is = s != 0.0f ? 1.0f / s : 0.0f;
  std::memcpy(out, &s, sizeof(float));
  auto* q = reinterpret_cast<int8_t*>(out + sizeof(float));
  for (int i = 0; i < n; ++i) q[i] = static_cast<int8_t>(round_even(x[i] * is));
}

void kv_store_row(KvFormat f, const float* src, void* dst, int head_dim) {
  switch (f) {
    case KvFormat::F32:
      std::memcpy(dst, src, sizeof(float) * head_dim);
      return;
    case KvFormat::F16: {
      auto* h = static_cast<uint16_t*>(dst);
      for (int i = 0; i < head_dim; ++i) h[i] = fp32_to_fp16(src[i]);
      return;
    }
    case KvFormat::Q8_0:
      store_q8_0(src, static_cast<BlockQ8_0*>(dst), head_dim);
      return;
    case KvFormat::Q8_HEAD:
      store_q8_head(src, static_cast<uint8_t*>(dst), head_dim);
      return;
    case KvFormat::Q4_0:
      store_q4_0(src, static_cast<BlockQ4_0*>(dst), head_dim);
      return;
  }
}

bool kv_format_tiles(KvFormat f) {
  return f == KvFormat::Q8_0 || f == KvFormat::Q4_0;
}

namespace {

void check_tile_row(KvFormat f, int r, int head_dim) {
  if (!kv_format_tiles(f)) throw std::invalid_argument(std::string("KV format ") + kv_format_name(f) + " has no tiles");
  if (r < 0 || r >= kKeyTileRows) throw std::invalid_argument("KV tile row " + std::to_string(r) + " is outside 0..15");
  kv_row_bytes(f, head_dim);  // throws for a head_dim the format cannot hold
}

static_assert(kKeyTileRows == kWeightTileRows, "a key tile is a weight tile");

// A key tile is the weight tile (quant.h) of the same block format: the layout has one home.
GgmlType key_tile_type(KvFormat f) {
  return f == KvFormat::Q8_0 ? GgmlType::Q8_0 : GgmlType::Q4_0;
}

// Calls fn(row_offset, tile_offset, bytes) for each piece of row r of a value tile (layout in kv_format.h).
template <typename Fn>
void for_each_value_piece(KvFormat f, int r, int head_dim, Fn&& fn) {
  const size_t block = f == KvFormat::Q8_0 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0);
  const size_t nb = kv_row_bytes(f, head_dim) / block;
  const size_t quants = block - sizeof(uint16_t);  // Q: bytes of a block's quants
  const size_t rr = static_cast<size_t>(r);
  for (size_t b = 0; b < nb; ++b) {
    fn(b * block, 2 * (kKeyTileRows * b + rr), sizeof(uint16_t));
    const size_t quad = 32 * nb + 4 * quants * (kKeyTileRows / 4 * b + rr / 4) + rr % 4;
    for (size_t j = 0; j < quants; ++j) fn(b * block + sizeof(uint16_t) + j, quad + 4 * j, size_t{1});
  }
}

}  // namespace

void kv_tile_put_row(KvFormat f, KvTile kind, const void* row, uint8_t* tile, int r, int head_dim) {
  check_tile_row(f, r, head_dim);
  if (kind == KvTile::Keys) {
    weight_tile_put_row(key_tile_type(f), row, tile, r, head_dim);
    return;
  }
  const auto* src = static_cast<const uint8_t*>(row);
  for_each_value_piece(f, r, head_dim, [&](size_t ro, size_t to, size_t n) { std::memcpy(tile + to, src + ro, n); });
}

void kv_tile_get_row(KvFormat f, KvTile kind, const uint8_t* tile, int r, void* row, int head_dim) {
  check_tile_row(f, r, head_dim);
  if (kind == KvTile::Keys) {
    weight_tile_get_row(key_tile_type(f), tile, r, row, head_dim);
    return;
  }
  auto* dst = static_cast<uint8_t*>(row);
  for_each_value_piece(f, r, head_dim, [&](size_t ro, size_t to, size_t n) { std::memcpy(dst + ro, tile + to, n); });
}

}  // namespace kvs
