// The avx512 level's bodies (kernels/x86_simd.inc with KVS_VNNI) built for a CPU without AVX-512, so that
// kvs_kernel_test checks them bit for bit against the reference on any x86-64 host with AVX2: the
// 512-bit intrinsics come from SIMDe's portable implementations (Debian's libsimde-dev, header-only),
// and the few that SIMDe 0.7 lacks are written out below with the instruction's semantics as Intel's
// SDM gives them. This is a test of the code's arithmetic, not of its speed: only kvs_kernel_test links
// it, and only where the CPU has no avx512 level of its own.
#include <immintrin.h>

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#include <cmath>
#include <cstdint>
#include <limits>

namespace kvs_emulated {

struct I32x16 {
  int32_t v[16];
};
struct F32x16 {
  float v[16];
};

inline I32x16 ints(simde__m512i a) {
  I32x16 r;
  simde_mm512_storeu_si512(r.v, a);
  return r;
}
inline F32x16 floats(simde__m512 a) {
  F32x16 r;
  simde_mm512_storeu_ps(r.v, a);
  return r;
}
inline simde__m512i from(const I32x16& r) {
  return simde_mm512_loadu_si512(r.v);
}
inline simde__m512 from(const F32x16& r) {
  return simde_mm512_loadu_ps(r.v);
}

// vpsrad: an arithmetic shift, counts above 31 fill with the sign.
inline simde__m512i srai_epi32(simde__m512i a, unsigned n) {
  I32x16 r = ints(a);
  for (int32_t& x : r.v) x >>= (n > 31 ? 31 : n);
  return from(r);
}

// vcvtdq2ps: int32 -> float, rounded to nearest even (the default MXCSR mode, as a C++ conversion).
inline simde__m512 cvtepi32_ps(simde__m512i a) {
  const I32x16 x = ints(a);
  F32x16 r;
  for (int i = 0; i < 16; ++i) r.v[i] = static_cast<float>(x.v[i]);
  return from(r);
}

// vcvtps2dq: float -> int32 in the current rounding mode; NaN and out-of-range values give 0x80000000.
inline simde__m512i cvtps_epi32(simde__m512 a) {
  const F32x16 x = floats(a);
  I32x16 r;
  for (int i = 0; i < 16; ++i) {
    const float f = std::nearbyint(x.v[i]);
    r.v[i] = (f >= -2147483648.0f && f < 2147483648.0f) ? static_cast<int32_t>(f) : std::numeric_limits<int32_t>::min();
  }
  return from(r);
}

// vpmovsxbd: 16 int8 -> 16 int32.
inline simde__m512i cvtepi8_epi32(__m128i a) {
  int8_t b[16];
  _mm_storeu_si128(reinterpret_cast<__m128i*>(b), a);
  I32x16 r;
  for (int i = 0; i < 16; ++i) r.v[i] = b[i];
  return from(r);
}

// vcvtph2ps: 16 f16 -> 16 float (exact), with F16C's scalar conversion.
inline simde__m512 cvtph_ps(__m256i a) {
  uint16_t h[16];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(h), a);
  F32x16 r;
  for (int i = 0; i < 16; ++i) r.v[i] = _cvtsh_ss(h[i]);
  return from(r);
}

// vcvtdq2pd: 8 int32 -> 8 double (exact).
inline simde__m512d cvtepi32_pd(__m256i a) {
  int32_t x[8];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(x), a);
  double r[8];
  for (int i = 0; i < 8; ++i) r[i] = x[i];
  return simde_mm512_loadu_pd(r);
}

// vcvtpd2ps: 8 double -> 8 float, rounded to nearest even.
inline __m256 cvtpd_ps(simde__m512d a) {
  double x[8];
  simde_mm512_storeu_pd(x, a);
  float r[8];
  for (int i = 0; i < 8; ++i) r[i] = static_cast<float>(x[i]);
  return _mm256_loadu_ps(r);
}

// vpcmpd with a write mask: bit i where k's bit i is set and a_i < b_i (signed).
inline simde__mmask16 mask_cmplt_epi32_mask(simde__mmask16 k, simde__m512i a, simde__m512i b) {
  const I32x16 x = ints(a), y = ints(b);
  unsigned m = 0;
  for (int i = 0; i < 16; ++i) m |= ((k >> i) & 1u) != 0 && x.v[i] < y.v[i] ? 1u << i : 0u;
  return static_cast<simde__mmask16>(m);
}

// vmovups with a write mask: only the lanes of k are written.
inline void mask_storeu_ps(void* p, simde__mmask16 k, simde__m512 a) {
  const F32x16 x = floats(a);
  auto* out = static_cast<float*>(p);
  for (int i = 0; i < 16; ++i) {
    if ((k >> i) & 1u) out[i] = x.v[i];
  }
}

// vexpandps from memory, zero-masked: consecutive floats from p fill k's lanes in order, the rest are 0.
inline simde__m512 maskz_expandloadu_ps(simde__mmask16 k, const void* p) {
  const auto* in = static_cast<const float*>(p);
  F32x16 r{};
  int j = 0;
  for (int i = 0; i < 16; ++i) {
    if ((k >> i) & 1u) r.v[i] = in[j++];
  }
  return from(r);
}

// The largest of the 16 lanes (the values this code reduces are never NaN).
inline float reduce_max_ps(simde__m512 a) {
  const F32x16 x = floats(a);
  float m = x.v[0];
  for (int i = 1; i < 16; ++i) m = x.v[i] > m ? x.v[i] : m;
  return m;
}

}  // namespace kvs_emulated

#define _mm512_srai_epi32(a, n) kvs_emulated::srai_epi32((a), (n))
#define _mm512_cvtepi32_ps(a) kvs_emulated::cvtepi32_ps(a)
#define _mm512_cvtps_epi32(a) kvs_emulated::cvtps_epi32(a)
#define _mm512_cvtepi8_epi32(a) kvs_emulated::cvtepi8_epi32(a)
#define _mm512_cvtph_ps(a) kvs_emulated::cvtph_ps(a)
#define _mm512_cvtepi32_pd(a) kvs_emulated::cvtepi32_pd(a)
#define _mm512_cvtpd_ps(a) kvs_emulated::cvtpd_ps(a)
#define _mm512_mask_cmplt_epi32_mask(k, a, b) kvs_emulated::mask_cmplt_epi32_mask((k), (a), (b))
#define _mm512_mask_storeu_ps(p, k, a) kvs_emulated::mask_storeu_ps((p), (k), (a))
#define _mm512_maskz_expandloadu_ps(k, p) kvs_emulated::maskz_expandloadu_ps((k), (p))
#define _mm512_reduce_max_ps(a) kvs_emulated::reduce_max_ps(a)

// The avx512 level under its own name, so that the test's avx512 expectations apply to it.
#define KVS_DOT_U8S8(u, s) _mm256_dpbusd_epi32(_mm256_setzero_si256(), (u), (s))
#define KVS_KERNELS_FN kernels_avx512_emulated
#define KVS_LEVEL_NAME "avx512"
#define KVS_WIDE_FLOAT 1
#define KVS_VNNI 1
#include "../kernels/x86_simd.inc"
