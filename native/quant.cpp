#include "quant.h"

#include <stdexcept>

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

TypeTraits type_traits(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::F32:
      return {"F32", 1, 4};
    case GgmlType::F16:
      return {"F16", 1, 2};
    case GgmlType::BF16:
      return {"BF16", 1, 2};
    case GgmlType::Q4_0:
      return {"Q4_0", kQK, sizeof(BlockQ4_0)};
    case GgmlType::Q4_1:
      return {"Q4_1", kQK, sizeof(BlockQ4_1)};
    case GgmlType::Q8_0:
      return {"Q8_0", kQK, sizeof(BlockQ8_0)};
  }
  throw std::invalid_argument("tensor type id " + std::to_string(type) +
                              " is not supported (supported: F32, F16, BF16, Q4_0, Q4_1, Q8_0)");
}

bool type_supported(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q8_0:
      return true;
  }
  return false;
}

size_t row_bytes(GgmlType type, int64_t n) {
  const TypeTraits t = type_traits(static_cast<uint32_t>(type));
  return static_cast<size_t>(n / t.block_elems) * static_cast<size_t>(t.block_bytes);
}

}  // namespace kvs
