#include "sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "vec.h"

namespace kvs {

namespace {

// The first i with acc + p[0] + ... + p[i] > u (p in token order, u < their sum), by chunks of 64: a
// chunk whose sum does not reach u is skipped whole. The last token with p > 0 if rounding leaves none.
int32_t walk(const float* p, int n, double u) {
  constexpr int kChunk = 64;
  double acc = 0.0;
  int i = 0;
  for (; i + kChunk <= n; i += kChunk) {
    const double c = sum8s(p + i, kChunk);
    if (acc + c > u) break;
    acc += c;
  }
  for (; i < n; ++i) {
    acc += p[i];
    if (u < acc) return i;
  }
  for (int j = n - 1; j > 0; --j) {
    if (p[j] > 0.0f) return j;
  }
  return 0;
}

}  // namespace

int32_t draw_token(const float* l, int nv, float temperature, int top_k, float top_p, std::mt19937_64& rng,
                   const Kernels& kern, DrawScratch& scratch) {
  const float mx = row_max(l, nv);
  if (temperature <= 0.0f || !std::isfinite(mx)) {  // greedy; and a row whose largest logit is +-inf
    const int i = first_index_of(l, nv, mx);
    return i < nv ? i : 0;  // a row of NaNs: token 0
  }
  auto by_logit = [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
  std::vector<int32_t>& cand = scratch.idx;
  if (top_k > 0 && top_k < nv) {
    // The top_k candidates in rank order, their weights exp((l - mx) / T) in float64.
    cand.resize(nv);
    std::iota(cand.begin(), cand.end(), 0);
    std::partial_sort(cand.begin(), cand.begin() + top_k, cand.end(), by_logit);
    cand.resize(top_k);
    std::vector<double>& p = scratch.pd;
    p.resize(cand.size());
    double sum = 0.0;
    for (size_t i = 0; i < cand.size(); ++i) {
      p[i] = std::exp((l[cand[i]] - mx) / temperature);
      sum += p[i];
    }
    size_t keep = cand.size();
    if (top_p < 1.0f) {
      double cum = 0.0;
      for (size_t i = 0; i < cand.size(); ++i) {
        cum += p[i] / sum;
        if (cum >= top_p) {
          keep = i + 1;
          break;
        }
      }
    }
    double kept = 0.0;
    for (size_t i = 0; i < keep; ++i) kept += p[i];
    const double u = std::uniform_real_distribution<double>(0.0, kept)(rng);
    double acc = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      acc += p[i];
      if (u < acc) return cand[i];
    }
    return cand[keep - 1];
  }

  // Every token: weights p = exp((l - mx) / T) in token order, without sorting the vocabulary (a full
  // sort cost more than the forward pass of a small model). The largest weight is exp(0) = 1.
  const float inv_t = 1.0f / temperature;
  if (!std::isfinite(inv_t)) return first_index_of(l, nv, mx);  // a temperature too small to divide by
  std::vector<float>& p = scratch.p;
  p.resize(nv);
  for (int i = 0; i < nv; ++i) p[i] = (l[i] - mx) * inv_t;
  float sum = kern.exp_sum(p.data(), nv, 0.0f);
  // exp_sum clamps its argument at -87.3, so a masked token (-inf) would keep a weight of ~1e-38; a NaN
  // logit (a broken row) gets weight 0 too, and then the sum is taken again without it.
  for (int i = 0; i < nv; ++i) p[i] = l[i] > -INFINITY ? p[i] : 0.0f;
  const int n8 = nv / 8 * 8;
  if (!std::isfinite(sum)) {
    sum = sum8s(p.data(), n8);
    for (int i = n8; i < nv; ++i) sum += p[i];
  }
  if (top_p >= 1.0f) return walk(p.data(), nv, std::uniform_real_distribution<double>(0.0, sum)(rng));

  // top_p: the nucleus is a prefix of the rank order, so it lies among the tokens of weight >= tau for
  // the largest tau (1/1024, 1/1024^2, ...) whose tokens already hold top_p of the mass; only those are
  // sorted.
  const double target = static_cast<double>(top_p) * sum;
  double mass = 0.0;
  for (float tau = 1.0f / 1024.0f;; tau /= 1024.0f) {
    cand.clear();
    mass = 0.0;
    for (int i = 0; i < n8; i += 8) {
      if (!any8_at_least(p.data() + i, tau)) continue;
      for (int k = i; k < i + 8; ++k) {
        if (p[k] >= tau) cand.push_back(k), mass += p[k];
      }
    }
    for (int k = n8; k < nv; ++k) {
      if (p[k] >= tau) cand.push_back(k), mass += p[k];
    }
    if (mass >= target || tau < 1e-30f) break;
  }
  std::sort(cand.begin(), cand.end(), by_logit);
  size_t keep = cand.size();
  double cum = 0.0;
  for (size_t i = 0; i < cand.size(); ++i) {
    cum += p[cand[i]];
    if (cum >= target) {
      keep = i + 1;
      break;
    }
  }
  double kept = 0.0;
  for (size_t i = 0; i < keep; ++i) kept += p[cand[i]];
  const double u = std::uniform_real_distribution<double>(0.0, kept)(rng);
  double acc = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    acc += p[cand[i]];
    if (u < acc) return cand[i];
  }
  return cand[keep - 1];
}

}  // namespace kvs
