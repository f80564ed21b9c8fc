// Kernel micro-benchmark: dot_q_rows over one weight matrix, the matmul's inner call, timed on one
// thread for several activation-row counts. Prints ns per weight element and activation row (one
// multiply-add) and the weight bytes per second. Built with KVS_BUILD_TESTS.
//   kvs_kernel_bench [level] [type] [rows] [cols] [reps]      e.g. kvs_kernel_bench avx2 Q4_1 1536 576 50
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../kernels/kernels.h"
#include "../quant.h"

using namespace kvs;

int main(int argc, char** argv) {
  const std::string level = argc > 1 ? argv[1] : "avx2";
  const std::string tname = argc > 2 ? argv[2] : "Q4_1";
  const int64_t rows = argc > 3 ? std::atoll(argv[3]) : 1536;
  const int64_t cols = argc > 4 ? std::atoll(argv[4]) : 576;
  const int reps = argc > 5 ? std::atoi(argv[5]) : 50;
  GgmlType type = GgmlType::F32;
  bool found = false;
  for (uint32_t i = 0; i < 64; ++i) {
    const auto t = static_cast<GgmlType>(i);
    if (type_is_quantized(t) && tname == type_traits(i).name) type = t, found = true;
  }
  if (!found) {
    std::fprintf(stderr, "unknown or non-quantized type %s\n", tname.c_str());
    return 2;
  }
  const Kernels& k = kernels_for(level);
  const size_t rb = row_bytes(type, cols);
  std::mt19937 rng(7);
  // Random quant bytes with every float16 scale field set to a small normal value: timing only.
  std::vector<uint8_t> w(rb * static_cast<size_t>(rows));
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  const size_t blk = type_traits(static_cast<uint32_t>(type)).block_bytes;
  if (type == GgmlType::Q4_0 || type == GgmlType::Q4_1 || type == GgmlType::Q8_0) {
    for (size_t o = 0; o < w.size(); o += blk) {
      const uint16_t h = 0x2000;
      std::memcpy(&w[o], &h, 2);
      if (type == GgmlType::Q4_1) std::memcpy(&w[o + 2], &h, 2);
    }
  }
  std::printf("# %s %s, %lld x %lld (%.2f MB of weights), one thread, best of %d\n", level.c_str(), tname.c_str(),
              static_cast<long long>(rows), static_cast<long long>(cols), w.size() / 1e6, reps);
  for (const int T : {1, 2, 4, 8, 16, 32}) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(T) * cols);
    for (auto& v : x) v = nd(rng);
    const int64_t nb = cols / kQK;
    std::vector<BlockQ8A> a(static_cast<size_t>(T) * nb);
    for (int t = 0; t < T; ++t) k.quantize_act(x.data() + t * cols, a.data() + t * nb, cols);
    std::vector<float> out(static_cast<size_t>(T) * rows);
    double best = 1e30;
    for (int rep = 0; rep < reps; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t r0 = 0; r0 < rows; r0 += kMaxRows) {
        const int R = static_cast<int>(std::min<int64_t>(kMaxRows, rows - r0));
        const void* wp[kMaxRows];
        float* op[kMaxRows];
        for (int r = 0; r < R; ++r) {
          wp[r] = w.data() + (r0 + r) * rb;
          op[r] = out.data() + r0 + r;
        }
        k.dot_q_rows(type, wp, R, a.data(), nb, T, cols, op, rows);
      }
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    const double macs = static_cast<double>(rows) * cols * T;
    std::printf("T=%-3d %8.4f ns/MAC  %7.2f GB/s of weights  %8.3f ms\n", T, best * 1e9 / macs, w.size() / best / 1e9,
                best * 1e3);
  }
  return 0;
}
