// Scalar reference kernels: the definition every SIMD level must match.
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels.h"

namespace kvs {
namespace {

float dot_f32(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy_f32(float alpha, const float* x, float* y, int n) {
  for (int i = 0; i < n; ++i) y[i] += alpha * x[i];
}

void dequant_q4_0(const BlockQ4_0* b, float* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, dst += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      dst[j] = static_cast<float>((b[i].qs[j] & 0x0f) - 8) * d;
      dst[j + kQK / 2] = static_cast<float>((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void dequant_q4_1(const BlockQ4_1* b, float* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, dst += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    const float m = fp16_to_fp32(b[i].m);
    for (int j = 0; j < kQK / 2; ++j) {
      dst[j] = static_cast<float>(b[i].qs[j] & 0x0f) * d + m;
      dst[j + kQK / 2] = static_cast<float>(b[i].qs[j] >> 4) * d + m;
    }
  }
}

void dequant_q8_0(const BlockQ8_0* b, float* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, dst += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kQK; ++j) dst[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

// One 32-element block b of a row in any of the newer block formats, as integers and the
// affine map of each 16-element half: element l has value s[l / 16] * q[l] + o[l / 16].
// Signed formats carry their offset in q (Q5_0: q - 16, Q6_K: q - 32, IQ4: the level), so
// o is 0 for them; formats with a min (Q5_1, Q2_K, Q4_K, Q5_K) keep q unsigned and put it in o.
struct Decoded32 {
  int q[kQK];
  float s[2];
  float o[2];
};

void decode32(GgmlType type, const void* row, int64_t b, Decoded32* out) {
  int* q = out->q;
  const int64_t sb = b / 8;               // super-block of a 256-element format
  const int j = static_cast<int>(b % 8);  // 32-element sub-block inside it
  switch (type) {
    case GgmlType::Q5_0:
    case GgmlType::Q5_1: {
      const bool q50 = type == GgmlType::Q5_0;
      const auto* b0 = static_cast<const BlockQ5_0*>(row) + b;
      const auto* b1 = static_cast<const BlockQ5_1*>(row) + b;
      const uint8_t* qs = q50 ? b0->qs : b1->qs;
      uint32_t qh;
      std::memcpy(&qh, q50 ? b0->qh : b1->qh, 4);
      for (int l = 0; l < kQK; ++l) {
        const int nib = l < 16 ? qs[l] & 15 : qs[l - 16] >> 4;
        q[l] = (nib | static_cast<int>((qh >> l) & 1u) << 4) - (q50 ? 16 : 0);
      }
      const float d = fp16_to_fp32(q50 ? b0->d : b1->d);
      const float m = q50 ? 0.0f : fp16_to_fp32(b1->m);
      out->s[0] = out->s[1] = d;
      out->o[0] = out->o[1] = m;
      return;
    }
    case GgmlType::IQ4_NL: {
      const auto* blk = static_cast<const BlockIQ4_NL*>(row) + b;
      for (int l = 0; l < kQK; ++l) q[l] = kIq4Levels[l < 16 ? blk->qs[l] & 15 : blk->qs[l - 16] >> 4];
      out->s[0] = out->s[1] = fp16_to_fp32(blk->d);
      out->o[0] = out->o[1] = 0.0f;
      return;
    }
    case GgmlType::IQ4_XS: {
      const auto* blk = static_cast<const BlockIQ4_XS*>(row) + sb;
      const uint8_t* qs = blk->qs + 16 * j;
      for (int l = 0; l < kQK; ++l) q[l] = kIq4Levels[l < 16 ? qs[l] & 15 : qs[l - 16] >> 4];
      const int ls = ((blk->scales_l[j / 2] >> (4 * (j % 2))) & 15) | ((blk->scales_h >> (2 * j)) & 3) << 4;
      out->s[0] = out->s[1] = fp16_to_fp32(blk->d) * static_cast<float>(ls - 32);
      out->o[0] = out->o[1] = 0.0f;
      return;
    }
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: {
      const bool q4 = type == GgmlType::Q4_K;
      const auto* b4 = static_cast<const BlockQ4_K*>(row) + sb;
      const auto* b5 = static_cast<const BlockQ5_K*>(row) + sb;
      const uint8_t* qs = (q4 ? b4->qs : b5->qs) + 32 * (j / 2);
      for (int l = 0; l < kQK; ++l) {
        q[l] = (qs[l] >> (4 * (j % 2))) & 15;
        if (!q4) q[l] |= ((b5->qh[l] >> j) & 1) << 4;
      }
      int sc, mn;
      k_scale_min(q4 ? b4->scales : b5->scales, j, &sc, &mn);
      out->s[0] = out->s[1] = fp16_to_fp32(q4 ? b4->d : b5->d) * static_cast<float>(sc);
      out->o[0] = out->o[1] = -(fp16_to_fp32(q4 ? b4->dmin : b5->dmin) * static_cast<float>(mn));
      return;
    }
    case GgmlType::Q6_K: {
      const auto* blk = static_cast<const BlockQ6_K*>(row) + sb;
      const int h = j / 4;          // 128-element half
      const int r0 = 32 * (j % 4);  // offset of this sub-block inside the half
      const float d = fp16_to_fp32(blk->d);
      for (int l = 0; l < kQK; ++l) {
        const int r = r0 + l;
        const int lo = (blk->ql[64 * h + r % 64] >> (4 * (r / 64))) & 15;
        const int hi = (blk->qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
        q[l] = (lo | hi << 4) - 32;
      }
      for (int k = 0; k < 2; ++k) {
        out->s[k] = d * static_cast<float>(blk->scales[2 * j + k]);
        out->o[k] = 0.0f;
      }
      return;
    }
    case GgmlType::Q3_K: {
      const auto* blk = static_cast<const BlockQ3_K*>(row) + sb;
      const float d = fp16_to_fp32(blk->d);
      for (int l = 0; l < kQK; ++l) {
        const int e = 32 * j + l;
        const int low = (blk->qs[32 * (e / 128) + l] >> (2 * ((e % 128) / 32))) & 3;
        const int high = (blk->hmask[l] >> (e / 32)) & 1;
        q[l] = low - (high ? 0 : 4);
      }
      for (int k = 0; k < 2; ++k) {
        out->s[k] = d * static_cast<float>(q3k_scale(blk->scales, 2 * j + k));
        out->o[k] = 0.0f;
      }
      return;
    }
    case GgmlType::Q2_K: {
      const auto* blk = static_cast<const BlockQ2_K*>(row) + sb;
      const float d = fp16_to_fp32(blk->d), dmin = fp16_to_fp32(blk->dmin);
      for (int l = 0; l < kQK; ++l) {
        const int e = 32 * j + l;
        q[l] = (blk->qs[32 * (e / 128) + l] >> (2 * ((e % 128) / 32))) & 3;
      }
      for (int k = 0; k < 2; ++k) {
        const uint8_t sc = blk->scales[2 * j + k];
        out->s[k] = d * static_cast<float>(sc & 15);
        out->o[k] = -(dmin * static_cast<float>(sc >> 4));
      }
      return;
    }
    default:
      break;
  }
  std::memset(out, 0, sizeof(*out));  // not a block format handled here
}

bool uses_decode32(GgmlType type) {
  switch (type) {
    case GgmlType::Q5_0:
    case GgmlType::Q5_1:
    case GgmlType::Q2_K:
    case GgmlType::Q3_K:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
    case GgmlType::IQ4_NL:
    case GgmlType::IQ4_XS:
      return true;
    default:
      return false;
  }
}

void dequant_row(GgmlType type, const void* src, float* dst, int64_t n) {
  switch (type) {
    case GgmlType::F32:
      std::memcpy(dst, src, sizeof(float) * n);
      return;
    case GgmlType::F16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
      return;
    }
    case GgmlType::BF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(h[i]);
      return;
    }
    case GgmlType::Q4_0:
      dequant_q4_0(static_cast<const BlockQ4_0*>(src), dst, n / kQK);
      return;
    case GgmlType::Q4_1:
      dequant_q4_1(static_cast<const BlockQ4_1*>(src), dst, n / kQK);
      return;
    case GgmlType::Q8_0:
      dequant_q8_0(static_cast<const BlockQ8_0*>(src), dst, n / kQK);
      return;
    default:
      break;
  }
  if (uses_decode32(type)) {
    Decoded32 blk;
    for (int64_t b = 0; b < n / kQK; ++b, dst += kQK) {
      decode32(type, src, b, &blk);
      for (int l = 0; l < kQK; ++l) {
        dst[l] = blk.s[l / 16] * static_cast<float>(blk.q[l]) + blk.o[l / 16];
      }
    }
  }
}

void kv_load_row(KvFormat f, const void* src, float* dst, int head_dim) {
  switch (f) {
    case KvFormat::F32:
      std::memcpy(dst, src, sizeof(float) * head_dim);
      return;
    case KvFormat::F16:
      dequant_row(GgmlType::F16, src, dst, head_dim);
      return;
    case KvFormat::Q8_0:
      dequant_row(GgmlType::Q8_0, src, dst, head_dim);
      return;
    case KvFormat::Q4_0:
      dequant_row(GgmlType::Q4_0, src, dst, head_dim);
      return;
    case KvFormat::Q8_HEAD: {
      float s;
      std::memcpy(&s, src, sizeof(float));
      const auto* q = static_cast<const int8_t*>(src) + sizeof(float);
      for (int i = 0; i < head_dim; ++i) dst[i] = static_cast<float>(q[i]) * s;
      return;
    }
  }
}

void quantize_act(const float* x, BlockQ8A* out, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* xb = x + b * kQK;
    float amax = 0.0f;
    for (int i = 0; i < kQK; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int i = 0; i < kQK; ++i) {
      const int q = static_cast<int>(std::nearbyint(xb[i] * id));
      out[b].qs[i] = static_cast<int8_t>(q);
      sum += q;
    }
    out[b].d = d;
    out[b].ds = d * static_cast<float>(sum);
  }
}

// The dot product terms of block b of a newer-format row (see kernels/x86_rows_sub.inc for the order):
//   isum = sc[0] sum_{l<16} (q + q_offset) x + sc[1] sum_{l>=16} (q + q_offset) x, q from decode32;
//   acc = fma(isum, d * a.d, acc); ds_term: acc = fma(m, a.ds, acc);
//   min16 (Q2_K): msum = mn[0] sum_{l<16} x + mn[1] sum_{l>=16} x, acc = fma(-msum, m * a.d, acc).
struct DotTerms {
  int q_offset = 0;    // Q5_0: 16 (the dot uses the unsigned quant, value = d q - 16 d)
  int sc[2] = {1, 1};  // integer 16-element scales (Q6_K, Q3_K, Q2_K)
  int mn[2] = {0, 0};  // Q2_K's integer 16-element mins
  float d = 0.0f;      // float scale of the integer sum
  float m = 0.0f;      // ds_term: the a.ds coefficient; min16: dmin
  bool ds_term = false;
  bool min16 = false;
};

DotTerms dot_terms(GgmlType type, const void* row, int64_t b, const Decoded32& blk) {
  DotTerms t;
  const int64_t sb = b / 8;
  const int j = static_cast<int>(b % 8);
  switch (type) {
    case GgmlType::Q5_0:
      t.q_offset = 16;
      t.d = blk.s[0];
      t.m = -16.0f * t.d;
      t.ds_term = true;
      break;
    case GgmlType::Q5_1:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:  // s = d (* sub-block scale), o = the minimum (-(dmin * min))
      t.d = blk.s[0];
      t.m = blk.o[0];
      t.ds_term = true;
      break;
    case GgmlType::IQ4_NL:
    case GgmlType::IQ4_XS:
      t.d = blk.s[0];
      break;
    case GgmlType::Q6_K: {
      const auto* k = static_cast<const BlockQ6_K*>(row) + sb;
      t.d = fp16_to_fp32(k->d);
      for (int h = 0; h < 2; ++h) t.sc[h] = k->scales[2 * j + h];
      break;
    }
    case GgmlType::Q3_K: {
      const auto* k = static_cast<const BlockQ3_K*>(row) + sb;
      t.d = fp16_to_fp32(k->d);
      for (int h = 0; h < 2; ++h) t.sc[h] = q3k_scale(k->scales, 2 * j + h);
      break;
    }
    case GgmlType::Q2_K: {
      const auto* k = static_cast<const BlockQ2_K*>(row) + sb;
      t.d = fp16_to_fp32(k->d);
      t.m = fp16_to_fp32(k->dmin);
      for (int h = 0; h < 2; ++h) {
        t.sc[h] = k->scales[2 * j + h] & 15;
        t.mn[h] = k->scales[2 * j + h] >> 4;
      }
      t.min16 = true;
      break;
    }
    default:
      break;
  }
  return t;
}

// Integer dot of 32 weights (as ints) with 32 int8 activations.
template <typename Get>
int32_t isum32(const Get& w, const int8_t* a) {
  int32_t s = 0;
  for (int i = 0; i < kQK; ++i) s += w(i) * a[i];
  return s;
}

// Q4_0, Q4_1 and Q8_0: one fma chain over the blocks, acc = fma(isum, d * a.d, acc) then the 4-bit
// formats' fma(m, a.ds, acc) (m = -8 d, or the Q4_1 minimum), the order every ISA level follows.
float dot_q(GgmlType type, const void* w, const BlockQ8A* a, int64_t n) {
  const int64_t nb = n / kQK;
  float sum = 0.0f;
  switch (type) {
    case GgmlType::Q4_0: {
      const auto* b = static_cast<const BlockQ4_0*>(w);
      for (int64_t i = 0; i < nb; ++i) {
        const uint8_t* qs = b[i].qs;
        const int32_t s = isum32([&](int j) { return j < 16 ? qs[j] & 0x0f : qs[j - 16] >> 4; }, a[i].qs);
        const float d = fp16_to_fp32(b[i].d);
        sum = std::fma(static_cast<float>(s), d * a[i].d, sum);
        sum = std::fma(-8.0f * d, a[i].ds, sum);
      }
      return sum;
    }
    case GgmlType::Q4_1: {
      const auto* b = static_cast<const BlockQ4_1*>(w);
      for (int64_t i = 0; i < nb; ++i) {
        const uint8_t* qs = b[i].qs;
        const int32_t s = isum32([&](int j) { return j < 16 ? qs[j] & 0x0f : qs[j - 16] >> 4; }, a[i].qs);
        sum = std::fma(static_cast<float>(s), fp16_to_fp32(b[i].d) * a[i].d, sum);
        sum = std::fma(fp16_to_fp32(b[i].m), a[i].ds, sum);
      }
      return sum;
    }
    case GgmlType::Q8_0: {
      const auto* b = static_cast<const BlockQ8_0*>(w);
      for (int64_t i = 0; i < nb; ++i) {
        const int32_t s = isum32([&](int j) { return static_cast<int>(b[i].qs[j]); }, a[i].qs);
        sum = std::fma(static_cast<float>(s), fp16_to_fp32(b[i].d) * a[i].d, sum);
      }
      return sum;
    }
    default:
      break;
  }
  if (uses_decode32(type)) {
    // The newer formats, per 32-element block (the order every ISA level follows, see
    // kernels/x86_rows_sub.inc): exact integer sums, then one fixed chain of fmas.
    Decoded32 blk;
    for (int64_t i = 0; i < nb; ++i) {
      decode32(type, w, i, &blk);
      const DotTerms dt = dot_terms(type, w, i, blk);
      int32_t qa[2] = {0, 0}, xs[2] = {0, 0};  // per 16-element half: sum q x, sum x
      for (int l = 0; l < kQK; ++l) {
        qa[l / 16] += (blk.q[l] + dt.q_offset) * a[i].qs[l];
        xs[l / 16] += a[i].qs[l];
      }
      const int32_t isum = dt.sc[0] * qa[0] + dt.sc[1] * qa[1];
      sum = std::fma(static_cast<float>(isum), dt.d * a[i].d, sum);
      if (dt.ds_term) sum = std::fma(dt.m, a[i].ds, sum);
      if (dt.min16) {
        const int32_t msum = dt.mn[0] * xs[0] + dt.mn[1] * xs[1];
        sum = std::fma(-static_cast<float>(msum), dt.m * a[i].d, sum);
      }
    }
    return sum;
  }
  return 0.0f;  // float weight types never take the quantized path
}

float score_row(KvFormat f, const uint8_t* krow, const float* q, const BlockQ8A* qq, int hd) {
  const int nb = hd / kQK;
  switch (f) {
    case KvFormat::F32:
    case KvFormat::F16: {
      float k[kMaxHeadDim];
      kv_load_row(f, krow, k, hd);
      return dot_f32(q, k, hd);
    }
    case KvFormat::Q8_0:
      return dot_q(GgmlType::Q8_0, krow, qq, hd);
    case KvFormat::Q4_0:
      return dot_q(GgmlType::Q4_0, krow, qq, hd);
    case KvFormat::Q8_HEAD: {
      float sk;
      std::memcpy(&sk, krow, sizeof(float));
      const auto* k = reinterpret_cast<const int8_t*>(krow) + sizeof(float);
      float acc = 0.0f;
      for (int b = 0; b < nb; ++b) {
        const int32_t is = isum32([&](int j) { return static_cast<int>(k[b * kQK + j]); }, qq[b].qs);
        acc += qq[b].d * static_cast<float>(is);
      }
      return sk * acc;
    }
  }
  return 0.0f;
}

void dot_q_batch(GgmlType type, const void* w, const BlockQ8A* a, int64_t a_stride, int T, int64_t n, float* out,
                 int64_t out_stride) {
  for (int t = 0; t < T; ++t) out[t * out_stride] = dot_q(type, w, a + t * a_stride, n);
}

void dot_q_rows(GgmlType type, const void* const* w, int R, const BlockQ8A* a, int64_t a_stride, int T, int64_t n,
                float* const* out, int64_t out_stride) {
  for (int r = 0; r < R; ++r) dot_q_batch(type, w[r], a, a_stride, T, n, out[r], out_stride);
}

void attn_scores(KvFormat f, const uint8_t* row0, size_t stride, int cnt, const float* q, const BlockQ8A* qq, int G,
                 int hd, float* s, int ld) {
  const int nb = hd / kQK;
  for (int j = 0; j < cnt; ++j) {
    for (int g = 0; g < G; ++g) {
      s[g * ld + j] = score_row(f, row0 + j * stride, q + static_cast<size_t>(g) * hd, qq + g * nb, hd);
    }
  }
}

void attn_accum(KvFormat f, const uint8_t* row0, size_t stride, int cnt, const float* w, int ld, float* acc, int G,
                int hd) {
  float v[kMaxHeadDim];
  for (int j = 0; j < cnt; ++j) {
    kv_load_row(f, row0 + j * stride, v, hd);
    for (int g = 0; g < G; ++g) axpy_f32(w[g * ld + j], v, acc + static_cast<size_t>(g) * hd, hd);
  }
}

float exp_sum(float* x, int n, float mx) {
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  return sum;
}

void silu_mul(float* g, const float* u, int n) {
  for (int i = 0; i < n; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

void gelu_tanh_mul(float* g, const float* u, int n) {
  for (int i = 0; i < n; ++i) {
    // 0.5 (1 + tanh(z)) = 1 / (1 + exp(-2z)) exactly; the right side, in double, keeps its relative
    // precision where 1 + tanh(z) cancels (in float at x = -8 it keeps one bit, in double at x = -6
    // about ten).
    const double x = g[i];
    const double z = static_cast<double>(kGeluSqrt2OverPi) * x * (1.0 + static_cast<double>(kGeluCubic) * x * x);
    g[i] = static_cast<float>(x / (1.0 + std::exp(-2.0 * z)) * u[i]);
  }
}

}  // namespace

void quantize_head(const float* x, BlockQ8A* out, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int b = 0; b < n / kQK; ++b) {
    int sum = 0;
    for (int i = 0; i < kQK; ++i) {
      const int q = static_cast<int>(std::nearbyint(x[b * kQK + i] * id));
      out[b].qs[i] = static_cast<int8_t>(q);
      sum += q;
    }
    out[b].d = d;
    out[b].ds = d * static_cast<float>(sum);
  }
}

void attn_accum_tiles_ref(KvFormat f, const uint8_t* const* tiles, int first, int n, const float* w, int ld, float* acc,
                          int G, int hd, const PrefetchRuns&) {
  if (!kv_format_tiles(f) || hd % kQK != 0 || first < 0 || first >= kKeyTileRows || n < 0 || n > kValueTaskRows) {
    throw std::invalid_argument("attn_accum_tiles: " + std::string(kv_format_name(f)) + " values, first " +
                                std::to_string(first) + ", " + std::to_string(n) + " rows, head_dim " +
                                std::to_string(hd) + " (q8_0 / q4_0, first < 16, at most 1024 rows)");
  }
  const int nb = hd / kQK;
  const int quants = f == KvFormat::Q8_0 ? kQK : kQK / 2;  // Q: bytes of a block's values
  auto tile_of = [&](int j) { return tiles[(first + j) / kKeyTileRows]; };
  auto scale = [&](int j, int b) {
    uint16_t h;
    std::memcpy(&h, tile_of(j) + 2 * (kKeyTileRows * b + (first + j) % kKeyTileRows), sizeof h);
    return fp16_to_fp32(h);
  };
  // Dim x of row j's block b (layout in kv_format.h).
  auto value = [&](int j, int b, int x) {
    const int r = (first + j) % kKeyTileRows;
    const uint8_t* quad = tile_of(j) + 32 * nb + 4 * quants * (kKeyTileRows / 4 * b + r / 4) + r % 4;
    if (f == KvFormat::Q8_0) return static_cast<int>(static_cast<int8_t>(quad[4 * x]));
    const uint8_t byte = quad[4 * (x % 16)];
    return (x < 16 ? byte & 0x0f : byte >> 4) - 8;
  };
  for (int g = 0; g < G; ++g) {
    const float* wg = w + static_cast<size_t>(g) * ld;
    for (int b = 0; b < nb; ++b) {
      float m = 0.0f;
      for (int j = 0; j < n; ++j) {
        const float p = std::fabs(wg[j] * scale(j, b));
        if (p > m) m = p;  // a NaN never replaces m (vmaxps keeps its second operand)
      }
      const int e = value_tile_exponent(m);
      const float up = std::ldexp(1.0f, -e), down = std::ldexp(1.0f, e);
      int64_t sum[kQK] = {};
      for (int j = 0; j < n; ++j) {
        const float p = wg[j] * scale(j, b);
        const int32_t u = value_tile_weight(p * up);
        for (int x = 0; x < kQK; ++x) sum[x] += static_cast<int64_t>(u) * value(j, b, x);
      }
      float* a = acc + static_cast<size_t>(g) * hd + b * kQK;
      for (int x = 0; x < kQK; ++x) a[x] += static_cast<float>(sum[x]) * down;
    }
  }
}

const float* zero_queries() {
  static const std::vector<float> zeros(static_cast<size_t>(kMaxGroup) * kMaxHeadDim, 0.0f);
  return zeros.data();
}

const Kernels& kernels_ref() {
  static const Kernels k{"ref",
                         dot_f32,
                         axpy_f32,
                         dequant_row,
                         kv_load_row,
                         quantize_act,
                         dot_q,
                         dot_q_batch,
                         attn_scores,
                         attn_accum,
                         exp_sum,
                         silu_mul,
                         gelu_tanh_mul,
                         dot_q_rows,
                         attn_scores_tile_rows<attn_scores>,
                         false,
                         attn_accum_tiles_ref,
                         false,
                         dot_q_tiles_rows<dot_q_rows>,
                         0};
  return k;
}

}  // namespace kvs
