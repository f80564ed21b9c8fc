#include "quant.h"

#include <stdexcept>
#include <vector>

namespace kvs {

float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;  // signed zero
    } else {
      // Subnormal half: normalise into a float exponent.
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | mant << 13;  // inf / nan
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t fp32_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan
    return sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u);
  }
  if (abs >= 0x477ff000u) {  // rounds to >= 65520: overflow to inf
    return sign | 0x7c00u;
  }
  if (abs < 0x38800000u) {               // below the smallest normal half (2^-14)
    if (abs < 0x33000000u) return sign;  // below half of the smallest subnormal
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // so that result is m >> (shift - 13 + ...)
    // value = m * 2^(e-150); subnormal unit is 2^-24 -> q = m * 2^(e-126)
    const uint32_t drop = shift;  // bits to drop from m (24-bit mantissa) = 126 - e
    uint32_t q = m >> drop;
    const uint32_t rem = m & ((1u << drop) - 1u);
    const uint32_t half = 1u << (drop - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return sign | static_cast<uint16_t>(q);
  }
  // Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even.
  uint32_t h = ((abs - 0x38000000u) >> 13);
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return sign | static_cast<uint16_t>(h);
}

namespace {

// Every type this engine reads: {id, name, elements per block, bytes per block}.
struct TypeRow {
  GgmlType type;
  TypeTraits traits;
};
constexpr TypeRow kTypes[] = {
    {GgmlType::F32, {"F32", 1, 4}},
    {GgmlType::F16, {"F16", 1, 2}},
    {GgmlType::BF16, {"BF16", 1, 2}},
    {GgmlType::Q4_0, {"Q4_0", kQK, sizeof(BlockQ4_0)}},
    {GgmlType::Q4_1, {"Q4_1", kQK, sizeof(BlockQ4_1)}},
    {GgmlType::Q5_0, {"Q5_0", kQK, sizeof(BlockQ5_0)}},
    {GgmlType::Q5_1, {"Q5_1", kQK, sizeof(BlockQ5_1)}},
    {GgmlType::Q8_0, {"Q8_0", kQK, sizeof(BlockQ8_0)}},
    {GgmlType::Q2_K, {"Q2_K", kQKK, sizeof(BlockQ2_K)}},
    {GgmlType::Q3_K, {"Q3_K", kQKK, sizeof(BlockQ3_K)}},
    {GgmlType::Q4_K, {"Q4_K", kQKK, sizeof(BlockQ4_K)}},
    {GgmlType::Q5_K, {"Q5_K", kQKK, sizeof(BlockQ5_K)}},
    {GgmlType::Q6_K, {"Q6_K", kQKK, sizeof(BlockQ6_K)}},
    {GgmlType::IQ4_NL, {"IQ4_NL", kQK, sizeof(BlockIQ4_NL)}},
    {GgmlType::IQ4_XS, {"IQ4_XS", kQKK, sizeof(BlockIQ4_XS)}},
};

const TypeRow* find_type(uint32_t type) {
  for (const TypeRow& r : kTypes) {
    if (static_cast<uint32_t>(r.type) == type) return &r;
  }
  return nullptr;
}

// GGML's names for the type ids it defines (nullptr: ids GGML retired, e.g. 4-5 and 31-33).
const char* ggml_name_or_null(uint32_t type) {
  static const char* const names[] = {
      "F32",   "F16",    "Q4_0",  "Q4_1",  nullptr, nullptr,   "Q5_0",   "Q5_1",    "Q8_0",  "Q8_1",   "Q2_K",
      "Q3_K",  "Q4_K",   "Q5_K",  "Q6_K",  "Q8_K",  "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S",
      "IQ2_S", "IQ4_XS", "I8",    "I16",   "I32",   "I64",     "F64",    "IQ1_M",   "BF16",  nullptr,  nullptr,
      nullptr, "TQ1_0",  "TQ2_0", nullptr, nullptr, nullptr,   "MXFP4",  "NVFP4",   "Q1_0"};
  if (type >= sizeof(names) / sizeof(names[0])) return nullptr;
  return names[type];
}

}  // namespace

const char* supported_type_list() {
  static const std::string list = [] {
    std::string s;
    for (const TypeRow& r : kTypes) s += (s.empty() ? "" : ", ") + std::string(r.traits.name);
    return s;
  }();
  return list.c_str();
}

std::string unsupported_type_message(uint32_t type, const std::string& where) {
  const char* n = ggml_name_or_null(type);
  return std::string("unsupported tensor type ") + (n != nullptr ? n : "id " + std::to_string(type)) +
         (where.empty() ? "" : " in " + where) + " (supported: " + supported_type_list() +
         "); re-quantize to one of them";
}

TypeTraits type_traits(uint32_t type) {
  if (const TypeRow* r = find_type(type)) return r->traits;
  throw std::invalid_argument(unsupported_type_message(type, ""));
}

bool type_supported(uint32_t type) {
  return find_type(type) != nullptr;
}

bool type_is_quantized(GgmlType type) {
  return type_supported(static_cast<uint32_t>(type)) && type != GgmlType::F32 && type != GgmlType::F16 &&
         type != GgmlType::BF16;
}

GgmlType type_from_name(const std::string& name) {
  for (const TypeRow& r : kTypes) {
    if (name == r.traits.name) return r.type;
  }
  throw std::invalid_argument("unknown weight type '" + name + "' (supported: " + supported_type_list() + ")");
}

size_t row_bytes(GgmlType type, int64_t n) {
  const TypeTraits t = type_traits(static_cast<uint32_t>(type));
  if (n < 0 || n % t.block_elems != 0) {
    throw std::invalid_argument("row_bytes: a " + std::string(t.name) + " row must be a multiple of " +
                                std::to_string(t.block_elems) + " elements, got " + std::to_string(n));
  }
  return static_cast<size_t>(n / t.block_elems) * static_cast<size_t>(t.block_bytes);
}

bool weight_tiles_type(GgmlType type) {
  return type == GgmlType::Q4_0 || type == GgmlType::Q4_1 || type == GgmlType::Q5_0 || type == GgmlType::Q8_0 ||
         type == GgmlType::Q4_K || type == GgmlType::Q5_K || type == GgmlType::Q6_K;
}

namespace {

// Calls fn(row_offset, tile_offset, bytes) for each piece of row r of a weight tile (layout in quant.h).
template <typename Fn>
void for_each_weight_tile_piece(GgmlType type, int r, int64_t n, Fn&& fn) {
  if (!weight_tiles_type(type)) {
    throw std::invalid_argument("weight type " + std::string(type_traits(static_cast<uint32_t>(type)).name) +
                                " has no tile layout (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K have)");
  }
  if (r < 0 || r >= kWeightTileRows) {
    throw std::invalid_argument("weight tile row " + std::to_string(r) + " is outside 0..15");
  }
  const size_t block = static_cast<size_t>(type_traits(static_cast<uint32_t>(type)).block_bytes);
  const size_t nb = row_bytes(type, n) / block;
  const bool two = type == GgmlType::Q4_1 || type == GgmlType::Q4_K || type == GgmlType::Q5_K;
  const size_t head = two ? 2 * sizeof(uint16_t) : sizeof(uint16_t);  // d (and m, or the K-quant's dmin)
  const size_t groups = (block - head) / 4;  // 4-byte groups of a block's quants (and Q5_0's high bits)
  const size_t scales = 32 * nb * (head / sizeof(uint16_t));
  // Where a block's f16 d and its groups start: Q6_K keeps d last, the others first.
  const size_t d_at = type == GgmlType::Q6_K ? block - sizeof(uint16_t) : 0;
  const size_t groups_at = type == GgmlType::Q6_K ? 0 : head;
  const size_t rr = static_cast<size_t>(r);
  for (size_t b = 0; b < nb; ++b) {
    fn(b * block + d_at, 2 * (kWeightTileRows * b + rr), sizeof(uint16_t));
    if (two) fn(b * block + sizeof(uint16_t), 32 * nb + 2 * (kWeightTileRows * b + rr), sizeof(uint16_t));
    for (size_t k = 0; k < groups; ++k)
      fn(b * block + groups_at + 4 * k, scales + 64 * (groups * b + k) + 4 * rr, size_t{4});
  }
}

}  // namespace

void weight_tile_put_row(GgmlType type, const void* row, uint8_t* tile, int r, int64_t n) {
  const auto* src = static_cast<const uint8_t*>(row);
  for_each_weight_tile_piece(type, r, n, [&](size_t ro, size_t to, size_t k) { std::memcpy(tile + to, src + ro, k); });
}

void weight_tile_get_row(GgmlType type, const uint8_t* tile, int r, void* row, int64_t n) {
  auto* dst = static_cast<uint8_t*>(row);
  for_each_weight_tile_piece(type, r, n, [&](size_t ro, size_t to, size_t k) { std::memcpy(dst + ro, tile + to, k); });
}

void pack_weight_tiles(GgmlType type, uint8_t* data, int64_t rows, int64_t n) {
  if (rows % kWeightTileRows != 0) {
    throw std::invalid_argument("pack_weight_tiles: " + std::to_string(rows) + " rows are not a multiple of 16");
  }
  const size_t rb = row_bytes(type, n), tile = kWeightTileRows * rb;
  std::vector<uint8_t> rows16(tile);
  for (int64_t t = 0; t < rows / kWeightTileRows; ++t) {
    uint8_t* p = data + static_cast<size_t>(t) * tile;
    std::memcpy(rows16.data(), p, tile);
    for (int r = 0; r < kWeightTileRows; ++r) weight_tile_put_row(type, rows16.data() + r * rb, p, r, n);
  }
}

}  // namespace kvs
