// Small float loops over one row, in GCC/Clang vector types (maxps / cmpps on x86, fmax / fcmeq on NEON)
// for the places outside the per-ISA kernel tables that scan a whole row: attention's row max and the
// sampler's scans of the vocabulary.
#pragma once

#include <cstring>
#include <limits>

namespace kvs {

typedef float Float4 __attribute__((vector_size(16)));
typedef int Int4 __attribute__((vector_size(16)));

inline Float4 load4(const float* x) {
  Float4 v;
  std::memcpy(&v, x, sizeof v);
  return v;
}

// max of x[0..n); NaNs never win (-inf for an empty or all-NaN row). A loop over a float[8] of std::max
// stayed scalar maxss (perf annotate, 8k decode), and std::max_element's compare-and-branch per element
// before it was a visible share of long-context decode.
inline float row_max(const float* x, int n) {
  const float inf = std::numeric_limits<float>::infinity();
  Float4 m0 = {-inf, -inf, -inf, -inf}, m1 = m0;
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const Float4 a = load4(x + i), b = load4(x + i + 4);
    m0 = a > m0 ? a : m0;
    m1 = b > m1 ? b : m1;
  }
  m0 = m1 > m0 ? m1 : m0;
  float r = m0[0];
  for (int k = 1; k < 4; ++k) r = m0[k] > r ? m0[k] : r;
  for (; i < n; ++i) r = x[i] > r ? x[i] : r;
  return r;
}

// True when any of x[i..i+8) is >= v.
inline bool any8_at_least(const float* x, float v) {
  const Float4 t = {v, v, v, v};
  const Int4 hit = (load4(x) >= t) | (load4(x + 4) >= t);
  return (hit[0] | hit[1] | hit[2] | hit[3]) != 0;
}

// The first i < n with x[i] == v, or n.
inline int first_index_of(const float* x, int n, float v) {
  const Float4 t = {v, v, v, v};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const Int4 hit = (load4(x + i) == t) | (load4(x + i + 4) == t);
    if ((hit[0] | hit[1] | hit[2] | hit[3]) != 0) break;
  }
  for (; i < n; ++i) {
    if (x[i] == v) return i;
  }
  return n;
}

// x[0] + ... + x[n-1] in 8 lanes (n a multiple of 8), then the lanes.
inline float sum8s(const float* x, int n) {
  Float4 s0 = {0, 0, 0, 0}, s1 = s0;
  for (int i = 0; i < n; i += 8) {
    s0 += load4(x + i);
    s1 += load4(x + i + 4);
  }
  s0 += s1;
  return (s0[0] + s0[1]) + (s0[2] + s0[3]);
}

}  // namespace kvs
