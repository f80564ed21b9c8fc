// AVX2 + FMA + F16C kernels. Compiled with -mavx2 -mfma -mf16c for this file
// only; chosen at run time when cpuid reports the features.
#include <immintrin.h>

#include <cstring>

#include "kernels.h"

namespace kvs {
namespace {

inline float hsum256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

float dot_f32(const float* a, const float* b, int n) {
  int i = 0;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  float s = hsum256(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy_f32(float alpha, const float* x, float* y, int n) {
  int i = 0;
  const __m256 va = _mm256_set1_ps(alpha);
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += alpha * x[i];
}

// 16 bytes of nibbles -> 32 floats (low nibbles first), as q*d + m.
inline void nibbles_to_f32(const uint8_t* qs, __m256 d, __m256 m, float* dst) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(raw, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
  const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  for (int p = 0; p < 4; ++p) {
    const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[p]));
    _mm256_storeu_ps(dst + 8 * p, _mm256_fmadd_ps(f, d, m));
  }
}

inline __m256 half_broadcast(uint16_t h) {
  return _mm256_set1_ps(_cvtsh_ss(h));
}

void dequant_row(GgmlType type, const void* src, float* dst, int64_t n) {
  switch (type) {
    case GgmlType::F16: {
      const auto* h = static_cast<const uint16_t*>(src);
      int64_t i = 0;
      for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
      }
      for (; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
      return;
    }
    case GgmlType::BF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      int64_t i = 0;
      for (; i + 8 <= n; i += 8) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
      }
      for (; i < n; ++i) dst[i] = bf16_to_fp32(h[i]);
      return;
    }
    case GgmlType::Q4_0: {
      const auto* b = static_cast<const BlockQ4_0*>(src);
      for (int64_t i = 0; i < n / kQK; ++i) {
        const __m256 d = half_broadcast(b[i].d);
        nibbles_to_f32(b[i].qs, d, _mm256_mul_ps(d, _mm256_set1_ps(-8.0f)), dst + i * kQK);
      }
      return;
    }
    case GgmlType::Q4_1: {
      const auto* b = static_cast<const BlockQ4_1*>(src);
      for (int64_t i = 0; i < n / kQK; ++i) {
        nibbles_to_f32(b[i].qs, half_broadcast(b[i].d), half_broadcast(b[i].m), dst + i * kQK);
      }
      return;
    }
    case GgmlType::Q8_0: {
      const auto* b = static_cast<const BlockQ8_0*>(src);
      for (int64_t i = 0; i < n / kQK; ++i) {
        const __m256 d = half_broadcast(b[i].d);
        for (int p = 0; p < 4; ++p) {
          const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b[i].qs + 8 * p));
          const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
          _mm256_storeu_ps(dst + i * kQK + 8 * p, _mm256_mul_ps(f, d));
        }
      }
      return;
    }
    case GgmlType::F32: break;
  }
  kernels_ref().dequant_row(type, src, dst, n);
}

void kv_load_row(KvFormat f, const void* src, float* dst, int head_dim) {
  switch (f) {
    case KvFormat::F16: dequant_row(GgmlType::F16, src, dst, head_dim); return;
    case KvFormat::Q8_0: dequant_row(GgmlType::Q8_0, src, dst, head_dim); return;
    case KvFormat::Q4_0: dequant_row(GgmlType::Q4_0, src, dst, head_dim); return;
    case KvFormat::Q8_HEAD: {
      float s;
      std::memcpy(&s, src, sizeof(float));
      const auto* q = static_cast<const int8_t*>(src) + sizeof(float);
      const __m256 vs = _mm256_set1_ps(s);
      int i = 0;
      for (; i + 8 <= head_dim; i += 8) {
        const __m128i qi = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i));
        _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(qi)), vs));
      }
      for (; i < head_dim; ++i) dst[i] = static_cast<float>(q[i]) * s;
      return;
    }
    case KvFormat::F32: break;
  }
  kernels_ref().kv_load_row(f, src, dst, head_dim);
}

}  // namespace

const Kernels& kernels_avx2() {
  static const Kernels k{"avx2", dot_f32, axpy_f32, dequant_row, kv_load_row};
  return k;
}

}  // namespace kvs
