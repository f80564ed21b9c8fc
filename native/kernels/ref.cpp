// Scalar reference kernels: the definition every SIMD level must match.
#include <cstring>

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

void dequant_row(GgmlType type, const void* src, float* dst, int64_t n) {
  switch (type) {
    case GgmlType::F32: std::memcpy(dst, src, sizeof(float) * n); return;
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
    case GgmlType::Q4_0: dequant_q4_0(static_cast<const BlockQ4_0*>(src), dst, n / kQK); return;
    case GgmlType::Q4_1: dequant_q4_1(static_cast<const BlockQ4_1*>(src), dst, n / kQK); return;
    case GgmlType::Q8_0: dequant_q8_0(static_cast<const BlockQ8_0*>(src), dst, n / kQK); return;
  }
}

void kv_load_row(KvFormat f, const void* src, float* dst, int head_dim) {
  switch (f) {
    case KvFormat::F32: std::memcpy(dst, src, sizeof(float) * head_dim); return;
    case KvFormat::F16: dequant_row(GgmlType::F16, src, dst, head_dim); return;
    case KvFormat::Q8_0: dequant_row(GgmlType::Q8_0, src, dst, head_dim); return;
    case KvFormat::Q4_0: dequant_row(GgmlType::Q4_0, src, dst, head_dim); return;
    case KvFormat::Q8_HEAD: {
      float s;
      std::memcpy(&s, src, sizeof(float));
      const auto* q = static_cast<const int8_t*>(src) + sizeof(float);
      for (int i = 0; i < head_dim; ++i) dst[i] = static_cast<float>(q[i]) * s;
      return;
    }
  }
}

}  // namespace

const Kernels& kernels_ref() {
  static const Kernels k{"ref", dot_f32, axpy_f32, dequant_row, kv_load_row};
  return k;
}

}  // namespace kvs
