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
  Q8_0 = 8,
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
// Bytes of one row of n elements; n must be a multiple of the block size.
size_t row_bytes(GgmlType type, int64_t n);

}  // namespace kvs
