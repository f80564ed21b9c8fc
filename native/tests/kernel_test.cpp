// Every kernel of every ISA level this machine runs, against the scalar
// reference (kernels/ref.cpp) on random inputs with odd lengths. Prints one line
// per failure and a closing "N passed, N failed"; exits 1 on any failure.
// Runs natively, and cross-compiled for aarch64 under qemu-user.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "../kernels/kernels.h"
#include "../kv_format.h"
#include "../quant.h"
#include "../sampling.h"

using namespace kvs;

#ifdef KVS_AVX512_EMULATED
namespace kvs {
const Kernels& kernels_avx512_emulated();  // tests/avx512_emulated.cpp
}
#endif

namespace {

int g_passed = 0, g_failed = 0;

void check(bool ok, const std::string& what) {
  if (ok) {
    ++g_passed;
  } else {
    ++g_failed;
    std::printf("FAIL %s\n", what.c_str());
  }
}

// |got - want| <= rel * scale + abs_tol
bool close(double got, double want, double scale, double rel, double abs_tol = 1e-6) {
  return std::fabs(got - want) <= rel * scale + abs_tol && std::isfinite(got);
}

std::vector<float> randn(std::mt19937& rng, size_t n, float sd) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Random valid blocks of the formats we only read (K-quants, Q5, IQ4): random bytes for the
// quants and packed scales, then sane f16 super-scales (|d| ~ 0.01, signs mixed).
template <typename B>
void set_scales(std::vector<uint8_t>& out, std::mt19937& rng, uint16_t B::*d, uint16_t B::*m) {
  std::uniform_real_distribution<float> u(0.002f, 0.02f);
  auto* b = reinterpret_cast<B*>(out.data());
  for (size_t i = 0; i < out.size() / sizeof(B); ++i) {
    b[i].*d = fp32_to_fp16(rng() % 2 ? u(rng) : -u(rng));
    if (m != nullptr) b[i].*m = fp32_to_fp16(u(rng));
  }
}

// The f16 scales of every block of the formats above (their quant bytes left as they are).
void set_block_scales(GgmlType type, std::vector<uint8_t>& out, std::mt19937& rng) {
  switch (type) {
    case GgmlType::Q5_0:
      set_scales<BlockQ5_0>(out, rng, &BlockQ5_0::d, nullptr);
      break;
    case GgmlType::Q5_1:
      set_scales<BlockQ5_1>(out, rng, &BlockQ5_1::d, &BlockQ5_1::m);
      break;
    case GgmlType::IQ4_NL:
      set_scales<BlockIQ4_NL>(out, rng, &BlockIQ4_NL::d, nullptr);
      break;
    case GgmlType::IQ4_XS:
      set_scales<BlockIQ4_XS>(out, rng, &BlockIQ4_XS::d, nullptr);
      break;
    case GgmlType::Q2_K:
      set_scales<BlockQ2_K>(out, rng, &BlockQ2_K::d, &BlockQ2_K::dmin);
      break;
    case GgmlType::Q3_K:
      set_scales<BlockQ3_K>(out, rng, &BlockQ3_K::d, nullptr);
      break;
    case GgmlType::Q4_K:
      set_scales<BlockQ4_K>(out, rng, &BlockQ4_K::d, &BlockQ4_K::dmin);
      break;
    case GgmlType::Q5_K:
      set_scales<BlockQ5_K>(out, rng, &BlockQ5_K::d, &BlockQ5_K::dmin);
      break;
    case GgmlType::Q6_K:
      set_scales<BlockQ6_K>(out, rng, &BlockQ6_K::d, nullptr);
      break;
    default:
      break;
  }
}

void random_blocks(GgmlType type, std::vector<uint8_t>& out, std::mt19937& rng) {
  for (auto& byte : out) byte = static_cast<uint8_t>(rng());
  set_block_scales(type, out, rng);
}

// The newer formats at the ends of their integer ranges: every quant byte (and packed integer scale) one
// value, so each weight is the format's largest or smallest quant, against activation blocks whose int8
// quants are all +127 or alternate +-127. Products then share a sign over whole blocks: the int16 sums of
// the SIMD bodies would saturate if they were not exact, and the results would leave the reference's bits.
void test_extremes(const Kernels& k, const Kernels& ref) {
  const GgmlType types[] = {GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q2_K,   GgmlType::Q3_K,  GgmlType::Q4_K,
                            GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS};
  std::mt19937 rng(5);
  constexpr int kRows = 8;  // one per extreme byte below
  for (GgmlType t : types) {
    const int n = type_traits(static_cast<uint32_t>(t)).block_elems == kQKK ? kQKK * 2 : 32 * 8;
    std::vector<std::vector<uint8_t>> rows;
    for (const uint8_t byte : {0x00, 0xff, 0x80, 0x7f, 0x88, 0x11, 0xee, 0x55}) {
      std::vector<uint8_t> row(row_bytes(t, n), byte);
      set_block_scales(t, row, rng);
      rows.push_back(row);
    }
    constexpr int T = 6;  // both the few-rows (T < 4) and the transposed body
    std::vector<BlockQ8A> qa(static_cast<size_t>(T) * n / kQK);
    for (int r = 0; r < T; ++r) {
      std::vector<float> x(n);
      for (int i = 0; i < n; ++i) x[i] = r % 2 == 0 ? (r % 4 == 0 ? 1.0f : -1.0f) : (i % 2 == 0 ? 1.0f : -1.0f);
      ref.quantize_act(x.data(), qa.data() + static_cast<size_t>(r) * n / kQK, n);
    }
    bool ok = true;
    for (const int TT : {1, 2, T}) {
      const void* wp[kRows];
      float* op[kRows];
      std::vector<float> o(static_cast<size_t>(kRows) * TT, NAN);
      for (int r = 0; r < kRows; ++r) {
        wp[r] = rows[r].data();
        op[r] = o.data() + static_cast<size_t>(r) * TT;
      }
      k.dot_q_rows(t, wp, kRows, qa.data(), n / kQK, TT, n, op, 1);
      for (int r = 0; r < kRows; ++r) {
        for (int a = 0; a < TT; ++a) {
          ok = ok && op[r][a] == ref.dot_q(t, wp[r], qa.data() + static_cast<size_t>(a) * (n / kQK), n);
        }
      }
    }
    // The reference itself against float64 over the dequantized weights and activations.
    for (int r = 0; r < kRows; ++r) {
      std::vector<float> wf(n);
      ref.dequant_row(t, rows[r].data(), wf.data(), n);
      for (int a = 0; a < T; ++a) {
        const BlockQ8A* at = qa.data() + static_cast<size_t>(a) * (n / kQK);
        double want = 0.0, scale = 0.0;
        for (int i = 0; i < n; ++i) {
          const double term = static_cast<double>(wf[i]) * at[i / kQK].d * at[i / kQK].qs[i % kQK];
          want += term;
          scale += std::fabs(term);
        }
        ok = ok && close(ref.dot_q(t, rows[r].data(), at, n), want, scale, 1e-5);
      }
    }
    check(ok, std::string(k.name) + " dot_q_rows extremes " + type_traits(static_cast<uint32_t>(t)).name);
  }
}

// A weight row of n elements in `type`, built with the reference encoders (or random blocks).
std::vector<uint8_t> make_row(GgmlType type, const std::vector<float>& x, std::mt19937& rng) {
  const size_t n = x.size();
  std::vector<uint8_t> out(row_bytes(type, static_cast<int64_t>(n)));
  switch (type) {
    case GgmlType::F32:
      std::memcpy(out.data(), x.data(), 4 * n);
      break;
    case GgmlType::F16:
      kv_store_row(KvFormat::F16, x.data(), out.data(), static_cast<int>(n));
      break;
    case GgmlType::BF16: {
      auto* h = reinterpret_cast<uint16_t*>(out.data());
      for (size_t i = 0; i < n; ++i) {
        uint32_t u;
        std::memcpy(&u, &x[i], 4);
        h[i] = static_cast<uint16_t>(u >> 16);
      }
      break;
    }
    case GgmlType::Q8_0:
      kv_store_row(KvFormat::Q8_0, x.data(), out.data(), static_cast<int>(n));
      break;
    case GgmlType::Q4_0:
      kv_store_row(KvFormat::Q4_0, x.data(), out.data(), static_cast<int>(n));
      break;
    case GgmlType::Q4_1: {
      auto* b = reinterpret_cast<BlockQ4_1*>(out.data());
      std::uniform_int_distribution<int> nib(0, 255);
      for (size_t i = 0; i < n / kQK; ++i) {
        b[i].d = fp32_to_fp16(0.01f + 0.001f * static_cast<float>(i));
        b[i].m = fp32_to_fp16(-0.07f);
        for (int j = 0; j < kQK / 2; ++j) b[i].qs[j] = static_cast<uint8_t>(nib(rng));
      }
      break;
    }
    default:
      random_blocks(type, out, rng);
      break;
  }
  return out;
}

void test_level(const Kernels& k, const Kernels& ref) {
  const std::string L = k.name;
  std::mt19937 rng(42);
  for (int n : {1, 7, 33, 100, 577}) {
    auto a = randn(rng, n, 1.0f), b = randn(rng, n, 1.0f);
    double scale = 0.0;
    for (int i = 0; i < n; ++i) scale += std::fabs(a[i] * b[i]);
    check(close(k.dot_f32(a.data(), b.data(), n), ref.dot_f32(a.data(), b.data(), n), scale, 1e-5),
          L + " dot_f32 n=" + std::to_string(n));
    auto y1 = randn(rng, n, 1.0f);
    auto y2 = y1;
    k.axpy_f32(0.37f, a.data(), y1.data(), n);
    ref.axpy_f32(0.37f, a.data(), y2.data(), n);
    bool ok = true;
    for (int i = 0; i < n; ++i) ok = ok && close(y1[i], y2[i], std::fabs(y2[i]), 1e-6);
    check(ok, L + " axpy_f32 n=" + std::to_string(n));
  }
  const GgmlType types[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0,   GgmlType::Q4_0,
                            GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q2_K,   GgmlType::Q3_K,
                            GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS};
  for (GgmlType t : types) {
    // 9 blocks of 32 (odd), or 3 super-blocks of 256 for the K formats.
    const int n = type_traits(static_cast<uint32_t>(t)).block_elems == kQKK ? kQKK * 3 : 32 * 9;
    auto x = randn(rng, n, 0.5f);
    auto row = make_row(t, x, rng);
    std::vector<float> got(n, NAN), want(n, NAN);
    k.dequant_row(t, row.data(), got.data(), n);
    ref.dequant_row(t, row.data(), want.data(), n);
    bool ok = true;
    for (int i = 0; i < n; ++i) ok = ok && close(got[i], want[i], std::fabs(want[i]), 1e-6);
    check(ok, L + " dequant_row " + type_traits(static_cast<uint32_t>(t)).name);
    if (type_is_quantized(t)) {
      auto act = randn(rng, n, 2.0f);
      std::vector<BlockQ8A> qa(n / kQK);
      ref.quantize_act(act.data(), qa.data(), n);
      double sc = 0.0;
      for (int i = 0; i < n; ++i) sc += std::fabs(want[i] * act[i]);
      check(close(k.dot_q(t, row.data(), qa.data(), n), ref.dot_q(t, row.data(), qa.data(), n), sc, 1e-5),
            L + " dot_q " + type_traits(static_cast<uint32_t>(t)).name);
      // 3, 11 and 17 activation rows (partial tiles, one and two tiles of 8), strided NaN-filled output.
      bool okb = true;
      for (const int T : {3, 11, 17}) {
        auto acts = randn(rng, static_cast<size_t>(T) * n, 2.0f);
        std::vector<BlockQ8A> qt(static_cast<size_t>(T) * n / kQK);
        for (int r = 0; r < T; ++r) ref.quantize_act(acts.data() + r * n, qt.data() + r * n / kQK, n);
        std::vector<float> o1(2 * T, NAN), o2(2 * T, NAN);
        k.dot_q_batch(t, row.data(), qt.data(), n / kQK, T, n, o1.data(), 2);
        ref.dot_q_batch(t, row.data(), qt.data(), n / kQK, T, n, o2.data(), 2);
        for (int r = 0; r < T; ++r) {
          okb = okb && close(o1[2 * r], o2[2 * r], sc, 1e-5) && std::isnan(o1[2 * r + 1]);
        }
        // A row's result must not depend on how many rows share the call (batch invariance),
        // and T = 1 must equal dot_q (the engine calls dot_q for single-token steps).
        float single = NAN;
        const BlockQ8A* a2 = qt.data() + 2 * (n / kQK);
        k.dot_q_batch(t, row.data(), a2, n / kQK, 1, n, &single, 1);
        okb = okb && single == o1[2 * 2] && single == k.dot_q(t, row.data(), a2, n);
      }
      check(okb, L + " dot_q_batch " + type_traits(static_cast<uint32_t>(t)).name);
      // dot_q_rows: R weight rows x T activation rows, each result the same bits as dot_q of its
      // (row, activation row) whatever R and T; for the formats in kRefExact also the reference's bits.
      const GgmlType kRefExact[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0};
      // The newer formats follow the reference's order on the x86 levels (kernels/x86_rows_sub.inc);
      // NEON keeps its own bodies for them.
      const GgmlType kRefExactX86[] = {GgmlType::Q5_0, GgmlType::Q5_1,   GgmlType::Q2_K,
                                       GgmlType::Q3_K, GgmlType::Q4_K,   GgmlType::Q5_K,
                                       GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS};
      const bool x86_level = L == "avx2" || L == "avx512" || L == "avx512_amx";
      // NEON keeps its own Q4_0/Q4_1 bodies too: bit-exactness with the reference is an x86 property.
      const bool ref_exact =
          x86_level && (std::find(std::begin(kRefExact), std::end(kRefExact), t) != std::end(kRefExact) ||
                        std::find(std::begin(kRefExactX86), std::end(kRefExactX86), t) != std::end(kRefExactX86));
      bool okr = true;
      std::vector<std::vector<uint8_t>> wrows;
      for (int r = 0; r < kMaxRows; ++r) wrows.push_back(make_row(t, randn(rng, n, 0.5f), rng));
      for (const int R : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 15, 16}) {
        for (const int T : {1, 2, 3, 4, 5, 16, 17}) {
          auto acts = randn(rng, static_cast<size_t>(T) * n, 2.0f);
          std::vector<BlockQ8A> qt(static_cast<size_t>(T) * n / kQK);
          for (int r = 0; r < T; ++r) ref.quantize_act(acts.data() + r * n, qt.data() + r * n / kQK, n);
          const void* wp[kMaxRows];
          std::vector<float> o(static_cast<size_t>(R) * T * 2, NAN);
          float* op[kMaxRows];
          for (int r = 0; r < R; ++r) {
            wp[r] = wrows[r].data();
            op[r] = o.data() + static_cast<size_t>(r) * T * 2;
          }
          k.dot_q_rows(t, wp, R, qt.data(), n / kQK, T, n, op, 2);
          for (int r = 0; r < R; ++r) {
            for (int a = 0; a < T; ++a) {
              const BlockQ8A* at = qt.data() + static_cast<size_t>(a) * (n / kQK);
              const float got = op[r][2 * a];
              okr = okr && std::isnan(op[r][2 * a + 1]) && got == k.dot_q(t, wp[r], at, n);
              if (ref_exact) okr = okr && got == ref.dot_q(t, wp[r], at, n);
            }
          }
        }
      }
      check(okr, L + " dot_q_rows " + type_traits(static_cast<uint32_t>(t)).name);
    }
  }
  {
    const int n = 32 * 5;
    auto x = randn(rng, n, 3.0f);
    std::vector<BlockQ8A> a(n / kQK), b(n / kQK);
    k.quantize_act(x.data(), a.data(), n);
    ref.quantize_act(x.data(), b.data(), n);
    bool ok = true;
    for (int i = 0; i < n / kQK; ++i) {
      ok = ok && close(a[i].d, b[i].d, b[i].d, 1e-6) && close(a[i].ds, b[i].ds, std::fabs(b[i].ds) + b[i].d, 1e-5);
      for (int j = 0; j < kQK; ++j) ok = ok && std::abs(a[i].qs[j] - b[i].qs[j]) <= 1;
    }
    check(ok, L + " quantize_act");
  }
  const KvFormat fmts[] = {KvFormat::F32, KvFormat::F16, KvFormat::Q8_0, KvFormat::Q8_HEAD, KvFormat::Q4_0};
  for (KvFormat f : fmts) {
    // Group sizes and row counts the bodies specialise on: G 1-8 compile-time, 12 run-time (3: the
    // transposed 16-row key body below the matmul's 4-row threshold);
    // 8-row score groups plus a tail (21); head dims with a Q4_0 block pair and an odd block (96).
    for (const int hd : {64, 96, 128}) {
      for (const int G : {1, 2, 3, 4, 5, 7, 8, 12}) {
        const int cnt = 21, ld = 24;
        const size_t rb = kv_row_bytes(f, hd);
        std::vector<uint8_t> rows(rb * cnt);
        for (int j = 0; j < cnt; ++j) {
          auto x = randn(rng, hd, 1.0f);
          kv_store_row(f, x.data(), rows.data() + j * rb, hd);
        }
        auto q = randn(rng, static_cast<size_t>(G) * hd, 1.0f);
        std::vector<BlockQ8A> qq(static_cast<size_t>(G) * hd / kQK);
        for (int g = 0; g < G; ++g) {
          if (f == KvFormat::Q8_HEAD) {
            quantize_head(q.data() + g * hd, qq.data() + g * hd / kQK, hd);
          } else {
            ref.quantize_act(q.data() + g * hd, qq.data() + g * hd / kQK, hd);
          }
        }
        std::vector<float> s1(G * ld, NAN), s2(G * ld, NAN);
        k.attn_scores(f, rows.data(), rb, cnt, q.data(), qq.data(), G, hd, s1.data(), ld);
        ref.attn_scores(f, rows.data(), rb, cnt, q.data(), qq.data(), G, hd, s2.data(), ld);
        bool ok = true;
        for (int g = 0; g < G; ++g) {
          for (int j = 0; j < ld; ++j) {
            const size_t i = static_cast<size_t>(g) * ld + j;
            // On x86, q8_0 / q4_0 keys go through the matmul's rows bodies: the same bits as the
            // reference's dot_q (NEON scores them per row, within the tolerance).
            const bool exact = L.rfind("avx", 0) == 0 && (f == KvFormat::Q8_0 || f == KvFormat::Q4_0);
            const bool same = exact ? s1[i] == s2[i] : close(s1[i], s2[i], 2.0 * hd, 1e-5);
            ok = ok && (j < cnt ? same : std::isnan(s1[i]));
          }
        }
        const std::string shape = " G=" + std::to_string(G) + " hd=" + std::to_string(hd) + " cnt=21";
        check(ok, L + " attn_scores " + kv_format_name(f) + shape);
        std::vector<float> w(G * ld), a1(G * hd), a2, a3;
        for (auto& x : w) x = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
        for (auto& x : a1) x = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
        a2 = a3 = a1;
        k.attn_accum(f, rows.data(), rb, cnt, w.data(), ld, a1.data(), G, hd);
        ref.attn_accum(f, rows.data(), rb, cnt, w.data(), ld, a2.data(), G, hd);
        ok = true;
        for (int i = 0; i < G * hd; ++i) ok = ok && close(a1[i], a2[i], std::fabs(a2[i]) + 4.0 * cnt, 1e-5);
        check(ok, L + " attn_accum " + kv_format_name(f) + shape);
        // The rows cut into calls as a block table cuts them (7 + 9 + 5) give the same bits: each
        // dim's sum runs over the rows in order whatever the calls.
        for (const auto& [j0, n] : {std::pair{0, 7}, {7, 9}, {16, 5}}) {
          k.attn_accum(f, rows.data() + j0 * rb, rb, n, w.data() + j0, ld, a3.data(), G, hd);
        }
        check(std::memcmp(a1.data(), a3.data(), a1.size() * sizeof(float)) == 0,
              L + " attn_accum in 3 calls " + kv_format_name(f) + shape);
      }
    }
  }
  for (KvFormat f : fmts) {
    const int hd = 64, cnt = 5;
    const size_t rb = kv_row_bytes(f, hd);
    std::vector<uint8_t> rows(rb * cnt);
    for (int j = 0; j < cnt; ++j) {
      auto x = randn(rng, hd, 1.0f);
      kv_store_row(f, x.data(), rows.data() + j * rb, hd);
    }
    std::vector<float> got(hd), want(hd);
    k.kv_load_row(f, rows.data(), got.data(), hd);
    ref.kv_load_row(f, rows.data(), want.data(), hd);
    bool ok = true;
    for (int i = 0; i < hd; ++i) ok = ok && close(got[i], want[i], std::fabs(want[i]), 1e-6);
    check(ok, L + " kv_load_row " + kv_format_name(f));
    for (int G : {1, 3}) {
      auto q = randn(rng, static_cast<size_t>(G) * hd, 1.0f);
      std::vector<BlockQ8A> qq(static_cast<size_t>(G) * hd / kQK);
      for (int g = 0; g < G; ++g) {
        if (f == KvFormat::Q8_HEAD) {
          quantize_head(q.data() + g * hd, qq.data() + g * hd / kQK, hd);
        } else {
          ref.quantize_act(q.data() + g * hd, qq.data() + g * hd / kQK, hd);
        }
      }
      const int ld = 8;
      std::vector<float> s1(G * ld, 0.0f), s2(G * ld, 0.0f);
      k.attn_scores(f, rows.data(), rb, cnt, q.data(), qq.data(), G, hd, s1.data(), ld);
      ref.attn_scores(f, rows.data(), rb, cnt, q.data(), qq.data(), G, hd, s2.data(), ld);
      ok = true;
      for (int i = 0; i < G * ld; ++i) ok = ok && close(s1[i], s2[i], 64.0, 1e-5);
      check(ok, L + " attn_scores " + kv_format_name(f) + " G=" + std::to_string(G));
      std::vector<float> w(G * ld, 0.25f), a1(G * hd, 1.0f), a2(G * hd, 1.0f);
      k.attn_accum(f, rows.data(), rb, cnt, w.data(), ld, a1.data(), G, hd);
      ref.attn_accum(f, rows.data(), rb, cnt, w.data(), ld, a2.data(), G, hd);
      ok = true;
      for (int i = 0; i < G * hd; ++i) ok = ok && close(a1[i], a2[i], std::fabs(a2[i]) + 1.0, 1e-5);
      check(ok, L + " attn_accum " + kv_format_name(f) + " G=" + std::to_string(G));
    }
  }
  {
    const int n = 203;
    std::uniform_real_distribution<float> u(-60.0f, 0.0f);
    std::vector<float> x(n);
    for (auto& v : x) v = u(rng);
    auto y = x;
    const float s1 = k.exp_sum(x.data(), n, 0.5f), s2 = ref.exp_sum(y.data(), n, 0.5f);
    bool ok = close(s1, s2, s2, 1e-5);
    for (int i = 0; i < n; ++i) ok = ok && close(x[i], y[i], y[i], 2e-6, 1e-30);
    check(ok, L + " exp_sum");
    std::normal_distribution<float> nd(0.0f, 4.0f);
    std::vector<float> g(n), up(n);
    for (int i = 0; i < n; ++i) {
      g[i] = nd(rng);
      up[i] = nd(rng);
    }
    g[0] = -100.0f;  // exp(100) overflows without clamping: must give -0, not NaN
    auto g2 = g;
    k.silu_mul(g.data(), up.data(), n);
    ref.silu_mul(g2.data(), up.data(), n);
    ok = true;
    for (int i = 0; i < n; ++i) ok = ok && close(g[i], g2[i], std::fabs(g2[i]), 1e-5);
    check(ok, L + " silu_mul");
    // GeGLU against the reference (double): normal(0, 4) inputs and the ends where exp(-2z)
    // overflows (x = -30: z ~ -1000, the product must be -0 times u, not NaN) or vanishes (x = 30).
    for (int i = 0; i < n; ++i) g[i] = nd(rng);
    g[0] = -30.0f;
    g[n - 1] = 30.0f;
    g2 = g;
    k.gelu_tanh_mul(g.data(), up.data(), n);
    ref.gelu_tanh_mul(g2.data(), up.data(), n);
    ok = true;
    for (int i = 0; i < n; ++i) ok = ok && close(g[i], g2[i], std::fabs(g2[i]), 1e-5, 1e-30);
    check(ok, L + " gelu_tanh_mul");
    // The reference against GELU's definition, 0.5 x (1 + tanh(z)) in double, where that form does
    // not cancel.
    const double xs[] = {-3.0, -1.0, -0.1, 0.0, 0.5, 2.0, 5.0};
    ok = true;
    for (double xv : xs) {
      float gv = static_cast<float>(xv), one = 1.0f;
      ref.gelu_tanh_mul(&gv, &one, 1);
      const double want = 0.5 * xv * (1.0 + std::tanh(0.7978845608028654 * (xv + 0.044715 * xv * xv * xv)));
      ok = ok && close(gv, want, std::fabs(want), 1e-6, 1e-30);
    }
    check(ok, L + " gelu_tanh_mul reference");
  }
}

}  // namespace

// kv_store_row's int8 rounding, derived by hand: a block whose largest magnitude is 127 has d = 1, so
// each value is stored as itself rounded to the nearest integer, ties to even.
// Key tiles (kv_format.h): the layout at hand-derived offsets, the round trip, and each level's tile
// body against its own row body on the same rows, bit for bit, for whole and partial tiles.
void test_key_tiles(const Kernels& k, const Kernels& ref) {
  const std::string L = k.name;
  std::mt19937 rng(31);
  for (const KvFormat f : {KvFormat::Q8_0, KvFormat::Q4_0}) {
    for (const int hd : {64, 96, 128}) {
      const int nb = hd / kQK;
      const size_t rb = kv_row_bytes(f, hd);
      const size_t blk = f == KvFormat::Q8_0 ? 34 : 18;  // ggml block bytes: f16 scale + quants
      std::vector<uint8_t> rows(rb * kKeyTileRows), tile(rb * kKeyTileRows, 0), back(rb);
      for (int j = 0; j < kKeyTileRows; ++j) {
        if (j % 4 == 3) {
          // Raw quant bytes (every int8 including -128, every nibble) under a sane scale.
          for (size_t i = 0; i < rb; ++i) rows[j * rb + i] = static_cast<uint8_t>(rng());
          for (int b = 0; b < nb; ++b) {
            const uint16_t d = fp32_to_fp16(0.01f * static_cast<float>(1 + b));
            std::memcpy(&rows[j * rb + b * blk], &d, sizeof d);
          }
        } else {
          auto x = randn(rng, hd, 1.0f);
          kv_store_row(f, x.data(), rows.data() + j * rb, hd);
        }
        kv_tile_put_row(f, KvTile::Keys, rows.data() + j * rb, tile.data(), j, hd);
      }
      bool ok = true;
      for (int j = 0; j < kKeyTileRows; ++j) {
        kv_tile_get_row(f, KvTile::Keys, tile.data(), j, back.data(), hd);
        ok = ok && std::memcmp(back.data(), rows.data() + j * rb, rb) == 0;
      }
      // Row 5: block 1's scale at 2 * (16 + 5); block 1's quant bytes 4..7 (group 1) at
      // 32 nb + 64 * (groups * 1 + 1) + 4 * 5, groups = 8 (q8_0) or 4 (q4_0).
      const size_t groups = f == KvFormat::Q8_0 ? 8 : 4;
      ok = ok && std::memcmp(&tile[2 * (16 + 5)], &rows[5 * rb + blk], 2) == 0;
      ok = ok && std::memcmp(&tile[32 * nb + 64 * (groups + 1) + 20], &rows[5 * rb + blk + 2 + 4], 4) == 0;
      check(ok, L + " key tile layout and round trip " + kv_format_name(f) + " hd=" + std::to_string(hd));
      for (const int G : {1, 2, 3, 5, 8, 12}) {
        auto q = randn(rng, static_cast<size_t>(G) * hd, 1.0f);
        std::vector<BlockQ8A> qq(static_cast<size_t>(G) * nb);
        for (int g = 0; g < G; ++g) ref.quantize_act(q.data() + g * hd, qq.data() + g * nb, hd);
        const int ld = 20;
        for (const auto& [off, cnt] : {std::pair{0, 16}, {0, 1}, {3, 9}, {15, 1}, {7, 9}}) {
          std::vector<float> s1(G * ld, NAN), s2(G * ld, NAN);
          k.attn_scores_tile(f, tile.data(), off, cnt, qq.data(), G, hd, s1.data(), ld);
          k.attn_scores(f, rows.data() + off * rb, rb, cnt, q.data(), qq.data(), G, hd, s2.data(), ld);
          bool same = true;
          for (int i = 0; i < G * ld; ++i) {
            same = same && (i % ld < cnt ? s1[i] == s2[i] : std::isnan(s1[i]));
          }
          check(same, L + " attn_scores_tile " + kv_format_name(f) + " hd=" + std::to_string(hd) +
                          " G=" + std::to_string(G) + " off=" + std::to_string(off) + " cnt=" + std::to_string(cnt));
        }
      }
    }
  }
}

// Weight tiles (quant.h) and dot_q_tiles (kernels.h): the layout at hand-derived offsets and the round
// trip, pack_weight_tiles in place, and dot_q_tiles against the level's dot_q (and, on x86, the
// reference's) bit for bit, with the gaps between output rows untouched.
void test_weight_tiles(const Kernels& k, const Kernels& ref) {
  const std::string L = k.name;
  const bool x86_level = L == "avx2" || L == "avx512" || L == "avx512_amx";
  std::mt19937 rng(47);
  // The level serves as tiles only types that have a tile layout; the x86 levels serve all of them.
  uint64_t layouts = 0;
  for (uint32_t t = 0; t < 64; ++t) layouts |= weight_tiles_type(static_cast<GgmlType>(t)) ? uint64_t{1} << t : 0;
  check((k.weight_tile_types & ~layouts) == 0 && (!x86_level || k.weight_tile_types == layouts),
        L + " weight_tile_types: the tile layouts (all of them on x86)");
  for (const GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K,
                           GgmlType::Q5_K, GgmlType::Q6_K}) {
    const std::string name = type_traits(static_cast<uint32_t>(t)).name;
    const bool k4 = t == GgmlType::Q4_K || t == GgmlType::Q5_K, k6 = t == GgmlType::Q6_K;  // k4: d, dmin first
    const bool super = k4 || k6;  // 256-element super-blocks: the layout's block
    for (const int n : super ? std::vector<int>{256, 512, 1536} : std::vector<int>{64, 96, 576}) {
      const int nb = n / kQK;                // activation blocks
      const int wb = super ? n / kQKK : nb;  // weight blocks
      const size_t rb = row_bytes(t, n);
      const size_t blk = rb / wb;
      const bool two = t == GgmlType::Q4_1 || k4;  // d and a second f16 (m, or the K-quant's dmin)
      constexpr int kTiles = 3;
      const int R = kWeightTileRows * kTiles;
      std::vector<uint8_t> rows(rb * R);
      for (int j = 0; j < R; ++j) {
        if (j % 4 == 3) {
          // Raw quant bytes (every int8 including -128, every nibble) under sane scales.
          for (size_t i = 0; i < rb; ++i) rows[j * rb + i] = static_cast<uint8_t>(rng());
          for (int b = 0; b < wb; ++b) {
            const uint16_t d = fp32_to_fp16(0.01f * static_cast<float>(1 + b));
            const uint16_t m = fp32_to_fp16((k4 ? 0.02f : -0.05f) * static_cast<float>(1 + b % 3));
            std::memcpy(&rows[j * rb + b * blk + (k6 ? blk - 2 : 0)], &d, sizeof d);  // Q6_K: d last
            if (two) std::memcpy(&rows[j * rb + b * blk + 2], &m, sizeof m);
          }
        } else {
          auto row = make_row(t, randn(rng, n, 0.5f), rng);
          std::memcpy(&rows[j * rb], row.data(), rb);
        }
      }
      std::vector<uint8_t> tiles = rows, back(rb);
      pack_weight_tiles(t, tiles.data(), R, n);
      bool ok = true;
      for (int j = 0; j < R; ++j) {
        weight_tile_get_row(t, tiles.data() + (j / 16) * 16 * rb, j % 16, back.data(), n);
        ok = ok && std::memcmp(back.data(), rows.data() + j * rb, rb) == 0;
      }
      // Row 5 of tile 1 (row 21), with wb weight blocks a row: block 1's scale at 2 * (16 + 5); Q4_1's
      // minimum (Q4_K's, Q5_K's dmin) at 32 wb + 2 * (16 + 5); block 1's bytes 4..7 after its head (group 1) at
      // S + 64 * (groups * 1 + 1) + 4 * 5, S = 32 wb (64 wb for Q4_1, Q4_K, Q5_K), groups = 8 (Q8_0), 5 (Q5_0:
      // qh, then its 16 nibble bytes), 35 (Q4_K: 12 scale bytes, 128 nibble bytes), 43 (Q5_K: 12 scale
      // bytes, 32 of qh, 128 nibble bytes), 52 (Q6_K: d last, so its head is 0 bytes in front and d is at
      // blk - 2) or 4.
      const uint8_t* tile1 = tiles.data() + 16 * rb;
      const uint8_t* row21 = rows.data() + 21 * rb;
      const size_t head = two ? 4 : k6 ? 0 : 2, d_at = k6 ? blk - 2 : 0;
      const size_t groups = t == GgmlType::Q8_0   ? 8
                            : t == GgmlType::Q5_0 ? 5
                            : t == GgmlType::Q4_K ? 35
                            : t == GgmlType::Q5_K ? 43
                            : k6                  ? 52
                                                  : 4;
      const size_t S = two ? 64 * wb : 32 * wb;
      if (wb >= 2) {
        ok = ok && std::memcmp(&tile1[2 * (16 + 5)], &row21[blk + d_at], 2) == 0;
        if (two) ok = ok && std::memcmp(&tile1[32 * wb + 2 * (16 + 5)], &row21[blk + 2], 2) == 0;
        ok = ok && std::memcmp(&tile1[S + 64 * (groups + 1) + 20], &row21[blk + head + 4], 4) == 0;
      }
      check(ok, L + " weight tile layout and round trip " + name + " n=" + std::to_string(n));
      bool same = true;
      for (const int T : {1, 2, 3, 5, 8, 16, 17, 24, 33, 40}) {
        auto acts = randn(rng, static_cast<size_t>(T) * n, 2.0f);
        std::vector<BlockQ8A> qt(static_cast<size_t>(T) * nb);
        for (int a = 0; a < T; ++a) ref.quantize_act(acts.data() + a * n, qt.data() + a * nb, n);
        const int64_t stride = R + 3;  // out[r + t * stride]: 3 untouched floats after each activation row
        std::vector<float> o(static_cast<size_t>(stride) * T, NAN);
        k.dot_q_tiles(t, tiles.data(), kTiles, qt.data(), nb, T, n, o.data(), stride);
        for (int a = 0; a < T; ++a) {
          const BlockQ8A* at = qt.data() + static_cast<size_t>(a) * nb;
          for (int j = 0; j < R; ++j) {
            const float got = o[a * stride + j];
            same = same && got == k.dot_q(t, rows.data() + j * rb, at, n);
            if (x86_level) same = same && got == ref.dot_q(t, rows.data() + j * rb, at, n);
          }
          for (int g = R; g < stride; ++g) same = same && std::isnan(o[a * stride + g]);
        }
      }
      check(same, L + " dot_q_tiles " + name + " n=" + std::to_string(n));
    }
  }
}

// Value tiles (kv_format.h) and attn_accum_tiles (kernels.h): the layout at hand-derived offsets and
// the round trip; a sum worked out by hand; each level against the reference bit for bit; the
// reference inside its derived bound of a float64 sum.
void test_value_tiles(const Kernels& k, const Kernels& ref) {
  const std::string L = k.name;
  std::mt19937 rng(37);
  // By hand, one q8_0 block (hd 32), d = 1: row 0 weight 1, row 1 weight 1/3. The block's largest
  // |w d| is 1 = 2^0, so e = 0 - 21 and u = (2^21, round(2^21 / 3) = 699051): the integer sum is
  // q0 * 2^21 + q1 * 699051 (exact in float64), rounded once to float, times 2^-21.
  {
    const size_t rb = kv_row_bytes(KvFormat::Q8_0, kQK);
    std::vector<uint8_t> tile(rb * kKeyTileRows, 0), row(rb);
    BlockQ8_0 b0{}, b1{};
    b0.d = b1.d = fp32_to_fp16(1.0f);
    for (int x = 0; x < kQK; ++x) {
      b0.qs[x] = static_cast<int8_t>(x - 16);
      b1.qs[x] = static_cast<int8_t>(x % 2 != 0 ? 127 - x : -128 + x);
    }
    kv_tile_put_row(KvFormat::Q8_0, KvTile::Values, &b0, tile.data(), 0, kQK);
    kv_tile_put_row(KvFormat::Q8_0, KvTile::Values, &b1, tile.data(), 1, kQK);
    const float w[2] = {1.0f, 1.0f / 3.0f};
    const uint8_t* tiles[1] = {tile.data()};
    for (const Kernels* lv : {&ref, &k}) {
      float acc[kQK] = {};
      lv->attn_accum_tiles(KvFormat::Q8_0, tiles, 0, 2, w, 2, acc, 1, kQK, {});
      bool ok = true;
      for (int x = 0; x < kQK; ++x) {
        const double want = (b0.qs[x] * 2097152.0 + b1.qs[x] * 699051.0) / 2097152.0;
        ok = ok && acc[x] == static_cast<float>(want);
      }
      check(ok, L + " attn_accum_tiles by hand (" + lv->name + ")");
    }
  }
  for (const KvFormat f : {KvFormat::Q8_0, KvFormat::Q4_0}) {
    for (const int hd : {64, 96, 128}) {
      const int nb = hd / kQK;
      const size_t rb = kv_row_bytes(f, hd);
      const size_t blk = f == KvFormat::Q8_0 ? 34 : 18;  // ggml block bytes: f16 scale + quants
      const size_t quants = blk - 2;
      constexpr int kTiles = 5;
      const int rows_n = kTiles * kKeyTileRows;
      std::vector<uint8_t> rows(rb * rows_n), tiles(rb * rows_n, 0xa5), back(rb);
      for (int j = 0; j < rows_n; ++j) {
        if (j % 7 == 3) {
          // Raw quant bytes (every int8 including -128, every nibble) under a sane scale, some negative.
          for (size_t i = 0; i < rb; ++i) rows[j * rb + i] = static_cast<uint8_t>(rng());
          for (int b = 0; b < nb; ++b) {
            const uint16_t d = fp32_to_fp16((j % 2 != 0 ? -0.01f : 0.02f) * static_cast<float>(1 + b));
            std::memcpy(&rows[j * rb + b * blk], &d, sizeof d);
          }
        } else {
          auto x = randn(rng, hd, j % 5 == 0 ? 4.0f : 1.0f);
          kv_store_row(f, x.data(), rows.data() + j * rb, hd);
        }
        kv_tile_put_row(f, KvTile::Values, rows.data() + j * rb, tiles.data() + j / kKeyTileRows * kKeyTileRows * rb,
                        j % kKeyTileRows, hd);
      }
      bool ok = true;
      for (int j = 0; j < rows_n; ++j) {
        kv_tile_get_row(f, KvTile::Values, tiles.data() + j / kKeyTileRows * kKeyTileRows * rb, j % kKeyTileRows,
                        back.data(), hd);
        ok = ok && std::memcmp(back.data(), rows.data() + j * rb, rb) == 0;
      }
      // Row 5 (quad 1, row 1 of it): block 1's scale at 2 * (16 + 5); block 1's quant byte 3 at
      // 32 nb + 4 Q (4 * 1 + 1) + 4 * 3 + 1, Q = 32 (q8_0) or 16 (q4_0).
      ok = ok && std::memcmp(&tiles[2 * (16 + 5)], &rows[5 * rb + blk], 2) == 0;
      ok = ok && tiles[32 * nb + 4 * quants * 5 + 13] == rows[5 * rb + blk + 2 + 3];
      check(ok, L + " value tile layout and round trip " + kv_format_name(f) + " hd=" + std::to_string(hd));
      std::vector<const uint8_t*> list(kTiles);
      for (int t = 0; t < kTiles; ++t) list[t] = tiles.data() + static_cast<size_t>(t) * kKeyTileRows * rb;
      // int8 value x of row j's block b, from the ggml row (q4_0: byte x % 16, low nibble for x < 16).
      auto q_of = [&](int j, int b, int x) {
        const uint8_t* qs = &rows[j * rb + b * blk + 2];
        if (f == KvFormat::Q8_0) return static_cast<double>(static_cast<int8_t>(qs[x]));
        return static_cast<double>((x < 16 ? qs[x % 16] & 0x0f : qs[x % 16] >> 4) - 8);
      };
      auto d_of = [&](int j, int b) {
        uint16_t h;
        std::memcpy(&h, &rows[j * rb + b * blk], 2);
        return static_cast<double>(fp16_to_fp32(h));
      };
      for (const int G : {1, 2, 3, 5, 8, 12}) {
        for (const auto& [first, n] :
             std::vector<std::pair<int, int>>{{0, 80}, {0, 1}, {3, 9}, {15, 1}, {7, 60}, {0, 0}}) {
          const int ld = 83;
          std::vector<float> w(static_cast<size_t>(G) * ld);
          std::uniform_real_distribution<float> uw(0.0f, 1.0f);
          for (auto& x : w) x = std::exp(-12.0f * uw(rng));
          w[0] = 1.0f;
          if (G > 1) w[ld + 1] = 0.0f;
          if (G > 2) w[2 * ld] = 1e-40f;  // subnormal
          std::vector<float> a1(static_cast<size_t>(G) * hd), a2;
          for (auto& x : a1) x = static_cast<float>(rng() % 5) - 2.0f;
          a2 = a1;
          const std::vector<float> a0 = a1;
          // The level asks for the tiles themselves (prefetches change no result).
          k.attn_accum_tiles(f, list.data(), first, n, w.data(), ld, a1.data(), G, hd, {list.data(), kTiles, rb});
          ref.attn_accum_tiles(f, list.data(), first, n, w.data(), ld, a2.data(), G, hd, {});
          const std::string shape = std::string(kv_format_name(f)) + " hd=" + std::to_string(hd) +
                                    " G=" + std::to_string(G) + " first=" + std::to_string(first) +
                                    " n=" + std::to_string(n);
          check(std::memcmp(a1.data(), a2.data(), a1.size() * sizeof(float)) == 0, L + " attn_accum_tiles " + shape);
          if (&k != &ref) continue;
          // |ref - exact| <= sum_j (2^-22 M_b + 2^-23 |w d|) |q| + 2^-23 |a0|, M_b the block's largest |w d|:
          // each weight rounded by 2^e / 2 <= 2^-22 M_b (M_b 2^-e >= 2^21), fl(w d) and the one float
          // rounding of the sum by 2^-24 each, the add to acc by 2^-24 of the result.
          bool inside = true;
          for (int g = 0; g < G; ++g) {
            for (int b = 0; b < nb; ++b) {
              double m = 0.0;
              for (int j = 0; j < n; ++j) m = std::max(m, std::fabs(w[g * ld + j] * d_of(first + j, b)));
              for (int x = 0; x < kQK; ++x) {
                double exact = a0[g * hd + b * kQK + x], bound = 2e-7 * std::fabs(exact) + 1e-30;
                for (int j = 0; j < n; ++j) {
                  const double wd = static_cast<double>(w[g * ld + j]) * d_of(first + j, b), q = q_of(first + j, b, x);
                  exact += wd * q;
                  bound += (std::ldexp(m, -22) + std::ldexp(std::fabs(wd), -23)) * std::fabs(q);
                }
                inside = inside && std::fabs(a2[g * hd + b * kQK + x] - exact) <= bound;
              }
            }
          }
          check(inside, "ref attn_accum_tiles inside its bound of float64 " + shape);
        }
      }
    }
  }
}

void test_kv_store_rounding() {
  float x[kQK] = {127.0f, 2.5f, 3.5f, -2.5f, -0.5f, 126.5f, 0.49999997f, -127.0f, 1.5f, -1.5f, 0.5f, 64.5f};
  const int8_t want[12] = {127, 2, 4, -2, 0, 126, 0, -127, 2, -2, 0, 64};
  BlockQ8_0 blk;
  kv_store_row(KvFormat::Q8_0, x, &blk, kQK);
  bool ok = fp16_to_fp32(blk.d) == 1.0f;
  for (int i = 0; i < 12; ++i) ok = ok && blk.qs[i] == want[i];
  for (int i = 12; i < kQK; ++i) ok = ok && blk.qs[i] == 0;
  check(ok, "kv_store_row q8_0 rounds to nearest, ties to even");
  uint8_t row[sizeof(float) + kQK];
  kv_store_row(KvFormat::Q8_HEAD, x, row, kQK);
  float s;
  std::memcpy(&s, row, sizeof s);
  ok = s == 1.0f;
  for (int i = 0; i < 12; ++i) ok = ok && static_cast<int8_t>(row[sizeof(float) + i]) == want[i];
  check(ok, "kv_store_row q8_head rounds to nearest, ties to even");
  // Against the definition written with libm (fmax for the largest magnitude, nearbyint for the rounding),
  // on random rows of several scales and on rows whose quotients x / d are exact halves (the ties).
  std::mt19937 rng(11);
  bool same = true;
  for (int r = 0; r < 4000 && same; ++r) {
    float xs[2 * kQK];
    auto v = randn(rng, 2 * kQK, std::ldexp(1.0f, r % 40 - 20));
    std::copy(v.begin(), v.end(), xs);
    if (r % 3 == 0) {
      for (int i = 0; i < 2 * kQK; ++i) xs[i] = static_cast<float>(static_cast<int>(rng() % 254) - 127) * 0.5f;
      xs[0] = 127.0f;  // each block's amax 127: d = 1, and every odd multiple of 0.5 is a tie
      xs[kQK] = -127.0f;
    }
    BlockQ8_0 got[2];
    kv_store_row(KvFormat::Q8_0, xs, got, 2 * kQK);
    uint8_t head[sizeof(float) + 2 * kQK];
    kv_store_row(KvFormat::Q8_HEAD, xs, head, 2 * kQK);
    float hmax = 0.0f;
    for (int i = 0; i < 2 * kQK; ++i) hmax = std::fmax(hmax, std::fabs(xs[i]));
    const float hs = hmax / 127.0f, his = hs != 0.0f ? 1.0f / hs : 0.0f;
    for (int i = 0; i < 2 * kQK; ++i) {
      same = same && static_cast<int8_t>(head[sizeof(float) + i]) == static_cast<int8_t>(std::nearbyint(xs[i] * his));
    }
    for (int b = 0; b < 2; ++b) {
      float amax = 0.0f;
      for (int i = 0; i < kQK; ++i) amax = std::fmax(amax, std::fabs(xs[b * kQK + i]));
      const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
      same = same && got[b].d == fp32_to_fp16(d);
      for (int i = 0; i < kQK; ++i)
        same = same && got[b].qs[i] == static_cast<int8_t>(std::nearbyint(xs[b * kQK + i] * id));
    }
  }
  check(same, "kv_store_row q8_0 / q8_head equal fmax and nearbyint's bytes");
}

// draw_token on one level's exp_sum: expectations derived by hand from the logits each case builds.
void test_draw(const Kernels& k) {
  const std::string L = std::string(k.name) + " draw_token ";
  const int nv = 49152;
  DrawScratch scratch;
  std::mt19937_64 rng(3);
  std::vector<float> l(nv);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& x : l) x = nd(rng);
  // Greedy: the first of two equal largest logits; a NaN never wins; a row of NaNs gives token 0.
  l[1234] = l[3000] = 50.0f;
  l[5] = NAN;
  check(draw_token(l.data(), nv, 0.0f, 0, 1.0f, rng, k, scratch) == 1234, L + "greedy first max");
  const int cold = draw_token(l.data(), nv, 1e-30f, 0, 1.0f, rng, k, scratch);  // only the tied maxima have weight
  check(cold == 1234 || cold == 3000, L + "tiny temperature draws a largest logit");
  std::vector<float> nans(nv, NAN);
  check(draw_token(nans.data(), nv, 0.7f, 0, 1.0f, rng, k, scratch) == 0, L + "NaN row");
  l[77] = INFINITY;
  check(draw_token(l.data(), nv, 0.7f, 0, 1.0f, rng, k, scratch) == 77, L + "+inf logit");
  // Masked: only tokens 7, 4000 and nv - 1 are finite, with equal logits: each 1/3 of 3000 draws.
  std::vector<float> m(nv, -INFINITY);
  m[7] = m[4000] = m[nv - 1] = 2.0f;
  m[11] = NAN;
  int hits[3] = {0, 0, 0};
  bool inside = true;
  for (int i = 0; i < 3000; ++i) {
    const int t = draw_token(m.data(), nv, 1.0f, 0, 1.0f, rng, k, scratch);
    if (t == 7)
      ++hits[0];
    else if (t == 4000)
      ++hits[1];
    else if (t == nv - 1)
      ++hits[2];
    else
      inside = false;
  }
  // sd of a 1/3 share over 3000 draws: sqrt(1/3 * 2/3 / 3000) = 0.0086; allow 6 of them (0.052)
  bool even = true;
  for (int h : hits) even = even && std::fabs(h / 3000.0 - 1.0 / 3.0) < 0.052;
  check(inside && even, L + "masked tokens never drawn, the others evenly");
  // top_p 0.75 over p = 0.5 (token 10), 0.3 (token 20), 0.2 spread over the rest: the nucleus is {10, 20}
  // (0.5 < 0.75 <= 0.8), drawn 0.5/0.8 = 0.625 and 0.375 of the time (sd 0.0077 over 4000 draws).
  std::vector<float> q(nv, std::log(0.2f / (nv - 2)));
  q[10] = std::log(0.5f);
  q[20] = std::log(0.3f);
  int n10 = 0;
  inside = true;
  for (int i = 0; i < 4000; ++i) {
    const int t = draw_token(q.data(), nv, 1.0f, 0, 0.75f, rng, k, scratch);
    n10 += t == 10;
    inside = inside && (t == 10 || t == 20);
  }
  check(inside && std::fabs(n10 / 4000.0 - 0.625) < 0.046, L + "top_p nucleus and its shares");
}

int main() {
  const Kernels& ref = kernels_ref();
  std::vector<std::pair<std::string, const Kernels*>> run;
  for (const std::string& level : available_isa_levels()) run.emplace_back(level, &kernels_for(level));
#ifdef KVS_AVX512_EMULATED
  // No avx512 level on this CPU: its bodies run over SIMDe's emulated intrinsics (tests/avx512_emulated.cpp).
  if (std::none_of(run.begin(), run.end(), [](const auto& r) { return r.first == "avx512"; })) {
    run.emplace_back("avx512-emulated", &kernels_avx512_emulated());
  }
#endif
  std::string levels;
  for (const auto& [level, k] : run) {
    levels += level + " ";
    test_level(*k, ref);
    test_draw(*k);
    test_key_tiles(*k, ref);
    test_value_tiles(*k, ref);
    test_weight_tiles(*k, ref);
    if (k->name == std::string("avx2") || std::string(k->name).rfind("avx512", 0) == 0) test_extremes(*k, ref);
  }
  test_kv_store_rounding();
  std::printf("levels: %s\n", levels.c_str());
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
