#include "membw.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <vector>

#include "huge_pages.h"
#include "threadpool.h"

namespace kvs {

double measure_read_bandwidth(int threads, size_t bytes, int repeats) {
  if (bytes < (1u << 20) || repeats < 1)
    throw std::invalid_argument("measure_read_bandwidth: need >= 1 MiB, >= 1 pass");
  const size_t n = bytes / sizeof(uint64_t);
  // In huge pages, as the weights are (gguf.h), so the limit is of the same kind of stream. On 4 KB pages
  // the read ran 0.87-1.01x as fast in 8 alternated pairs (2 threads, 2026-12-04).
  const std::shared_ptr<uint8_t> mem = map_huge_pages(n * sizeof(uint64_t));
  auto* buf = reinterpret_cast<uint64_t*>(mem.get());
  ThreadPool pool(threads);
  // First touch from the pool's threads so pages are mapped before timing.
  pool.parallel_for(static_cast<int64_t>(n), [&](int, int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) buf[i] = static_cast<uint64_t>(i);
  });
  std::vector<uint64_t> sink(threads, 0);
  double best = 0.0;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(static_cast<int64_t>(n), [&](int t, int64_t b, int64_t e) {
      // Four independent accumulators keep the loads, not the adds, the bottleneck.
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      int64_t i = b;
      for (; i + 4 <= e; i += 4) {
        s0 += buf[i];
        s1 += buf[i + 1];
        s2 += buf[i + 2];
        s3 += buf[i + 3];
      }
      for (; i < e; ++i) s0 += buf[i];
      sink[t] += s0 + s1 + s2 + s3;
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(n * sizeof(uint64_t)) / s);
  }
  volatile uint64_t keep = 0;
  for (uint64_t v : sink) keep = keep + v;
  (void)keep;
  return best;
}

}  // namespace kvs
