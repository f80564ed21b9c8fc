// Kernel micro-benchmark: dot_q_rows over one weight matrix, the matmul's inner call, timed on one
// thread for several activation-row counts. Prints ns per weight element and activation row (one
// multiply-add) and the weight bytes per second, after the rate a plain read of as many bytes
// reaches. Built with KVS_BUILD_TESTS.
//   kvs_kernel_bench [level] [type] [rows] [cols] [reps]      e.g. kvs_kernel_bench avx2 Q4_1 1536 576 50
// Attention mode: one decode step's attention over a deep context (every layer's K/V well past the
// last-level cache), cut into 16-position blocks as the engine's cache is, one thread. Prints ns per
// K/V row (all G query heads) for the scores, the softmax numerators and the V sums apart and together.
// K and V are stored as the engine's CPU pool stores them: key and value tiles where the level has the
// tile bodies (kv_format.h; the V sums of 512 positions per call, as the engine's tasks), unless the
// last argument is "tiles" (key tiles, V rows) or "rows".
//   kvs_kernel_bench attn [level] [kv format] [positions] [layers] [G] [head_dim] [reps] [vtiles|tiles|rows]
//   e.g. kvs_kernel_bench attn avx512 q4_0 8150 30 3 64 5
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../huge_pages.h"
#include "../kernels/kernels.h"
#include "../kv_format.h"
#include "../membw.h"
#include "../quant.h"

using namespace kvs;

namespace {

int attention_bench(int argc, char** argv) {
  const std::string level = argc > 2 ? argv[2] : "avx2";
  const KvFormat f = kv_format_from_string(argc > 3 ? argv[3] : "q4_0");
  const int positions = argc > 4 ? std::atoi(argv[4]) : 8150;
  const int layers = argc > 5 ? std::atoi(argv[5]) : 30;
  const int G = argc > 6 ? std::atoi(argv[6]) : 3;
  const int hd = argc > 7 ? std::atoi(argv[7]) : 64;
  const int reps = argc > 8 ? std::atoi(argv[8]) : 5;
  constexpr int kBlock = 16;
  const Kernels& k = kernels_for(level);
  const std::string layout = argc > 9 ? argv[9] : "vtiles";
  const bool tiles = k.key_tiles && kv_format_tiles(f) && layout != "rows";
  const bool vtiles = tiles && k.value_tiles && layout == "vtiles";
  const size_t rb = kv_row_bytes(f, hd);
  const int n_blocks = (positions + kBlock - 1) / kBlock;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // Per layer one run of blocks for K and one for V, each block a 64-byte-aligned slot of kBlock rows.
  const size_t slot = (kBlock * rb + 63) / 64 * 64;
  const size_t n_slots = static_cast<size_t>(n_blocks) * layers;
  std::vector<uint8_t> kmem(slot * n_slots + 63), vmem(kmem.size());
  auto aligned = [](std::vector<uint8_t>& m) {
    return m.data() + ((64 - reinterpret_cast<uintptr_t>(m.data()) % 64) % 64);
  };
  uint8_t* const kbase = aligned(kmem);
  uint8_t* const vbase = aligned(vmem);
  std::vector<float> row(hd);
  std::vector<uint8_t> enc(rb);
  for (size_t b = 0; b < n_slots; ++b) {
    for (int j = 0; j < kBlock; ++j) {
      for (auto& x : row) x = nd(rng);
      if (tiles) {
        kv_store_row(f, row.data(), enc.data(), hd);
        kv_tile_put_row(f, KvTile::Keys, enc.data(), kbase + b * slot, j, hd);
      } else {
        kv_store_row(f, row.data(), kbase + b * slot + j * rb, hd);
      }
      if (vtiles) {
        kv_store_row(f, row.data(), enc.data(), hd);
        kv_tile_put_row(f, KvTile::Values, enc.data(), vbase + b * slot, j, hd);
      } else {
        kv_store_row(f, row.data(), vbase + b * slot + j * rb, hd);
      }
    }
  }
  std::vector<float> q(static_cast<size_t>(G) * hd), s(static_cast<size_t>(G) * positions), acc(q.size());
  for (auto& x : q) x = 0.125f * nd(rng);
  std::vector<BlockQ8A> qq(static_cast<size_t>(G) * hd / kQK);
  for (int g = 0; g < G; ++g) k.quantize_act(q.data() + g * hd, qq.data() + g * hd / kQK, hd);
  auto blk = [&](uint8_t* base, int layer, int bi) {
    return base + (static_cast<size_t>(layer) * n_blocks + bi) * slot;
  };
  double best[4] = {1e30, 1e30, 1e30, 1e30};
  float sink = 0.0f;
  for (int rep = 0; rep < reps; ++rep) {
    double t[3] = {0, 0, 0};
    for (int layer = 0; layer < layers; ++layer) {
      auto t0 = std::chrono::steady_clock::now();
      for (int bi = 0; bi < n_blocks; ++bi) {
        const int cnt = std::min(kBlock, positions - bi * kBlock);
        if (tiles) {
          k.attn_scores_tile(f, blk(kbase, layer, bi), 0, cnt, qq.data(), G, hd, s.data() + bi * kBlock, positions);
        } else {
          k.attn_scores(f, blk(kbase, layer, bi), rb, cnt, q.data(), qq.data(), G, hd, s.data() + bi * kBlock,
                        positions);
        }
      }
      auto t1 = std::chrono::steady_clock::now();
      for (int g = 0; g < G; ++g) sink += k.exp_sum(s.data() + g * positions, positions, 0.0f);
      auto t2 = std::chrono::steady_clock::now();
      std::fill(acc.begin(), acc.end(), 0.0f);
      // Value tiles: one call per 512 positions, as the engine's tasks.
      for (int p0 = 0; vtiles && p0 < positions; p0 += 512) {
        const uint8_t* list[512 / kBlock];
        const int cnt = std::min(512, positions - p0);
        for (int t = 0; t < (cnt + kBlock - 1) / kBlock; ++t) list[t] = blk(vbase, layer, p0 / kBlock + t);
        k.attn_accum_tiles(f, list, 0, cnt, s.data() + p0, positions, acc.data(), G, hd, {});
      }
      for (int bi = 0; !vtiles && bi < n_blocks; ++bi) {
        const int cnt = std::min(kBlock, positions - bi * kBlock);
        k.attn_accum(f, blk(vbase, layer, bi), rb, cnt, s.data() + bi * kBlock, positions, acc.data(), G, hd);
      }
      auto t3 = std::chrono::steady_clock::now();
      sink += acc[0];
      t[0] += std::chrono::duration<double>(t1 - t0).count();
      t[1] += std::chrono::duration<double>(t2 - t1).count();
      t[2] += std::chrono::duration<double>(t3 - t2).count();
    }
    for (int i = 0; i < 3; ++i) best[i] = std::min(best[i], t[i]);
    best[3] = std::min(best[3], t[0] + t[1] + t[2]);
  }
  const double n_rows = static_cast<double>(positions) * layers;
  std::printf(
      "# attention %s %s (keys as %s, values as %s), %d positions x %d layers, G=%d, hd=%d, %.1f MB of K+V, one "
      "thread, "
      "best of %d\n",
      level.c_str(), kv_format_name(f), tiles ? "tiles" : "rows", vtiles ? "tiles" : "rows", positions, layers, G, hd,
      2.0 * n_rows * rb / 1e6, reps);
  std::printf("ns per K/V row: scores %.2f  exp %.2f  accum %.2f  all %.2f  (%.2f GB/s of K+V)  [%g]\n",
              best[0] * 1e9 / n_rows, best[1] * 1e9 / n_rows, best[2] * 1e9 / n_rows, best[3] * 1e9 / n_rows,
              2.0 * n_rows * rb / best[3] / 1e9, static_cast<double>(sink != 0.0f));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "attn") return attention_bench(argc, argv);
  const std::string level = argc > 1 ? argv[1] : "avx2";
  const std::string tname = argc > 2 ? argv[2] : "Q4_1";
  const int64_t rows = argc > 3 ? std::atoll(argv[3]) : 1536;
  const int64_t cols = argc > 4 ? std::atoll(argv[4]) : 576;
  const int reps = argc > 5 ? std::atoi(argv[5]) : 50;
  // "tiles": the rows packed as weight tiles (quant.h) and served by dot_q_tiles, as the CPU backend does.
  const bool tiles = argc > 6 && std::string(argv[6]) == "tiles";
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
  // The weights live as the engine's do: in transparent huge pages (gguf.cpp copies the model file there),
  // at a 64-byte boundary. KVS_BENCH_W_OFFSET moves them off it and KVS_BENCH_PAGES=plain puts them in
  // ordinary 4 KB pages, to measure what a misaligned tensor or a model without the copy costs.
  const char* off_env = std::getenv("KVS_BENCH_W_OFFSET");
  const char* pages_env = std::getenv("KVS_BENCH_PAGES");
  const size_t w_offset = off_env ? static_cast<size_t>(std::atoll(off_env)) : 0;
  const bool plain_pages = pages_env != nullptr && std::string(pages_env) == "plain";
  const size_t w_bytes = rb * static_cast<size_t>(rows);
  bool advised = false;
  std::shared_ptr<uint8_t> w_map;
  if (plain_pages) {
    w_map.reset(new uint8_t[w_bytes + w_offset + 64], std::default_delete<uint8_t[]>());
  } else {
    w_map = map_huge_pages(w_bytes + w_offset + 64, &advised);
  }
  uint8_t* const w =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(w_map.get()) + 63) & ~uintptr_t{63}) + w_offset;
  // Random quant bytes with every float16 scale field set to a small normal value: timing only.
  for (size_t i = 0; i < w_bytes; ++i) w[i] = static_cast<uint8_t>(rng());
  const size_t blk = type_traits(static_cast<uint32_t>(type)).block_bytes;
  if (weight_tiles_type(type)) {
    for (size_t o = 0; o < w_bytes; o += blk) {
      const uint16_t h = 0x2000;
      std::memcpy(&w[o + (type == GgmlType::Q6_K ? blk - 2 : 0)], &h, 2);  // Q6_K keeps its d last
      if (type == GgmlType::Q4_1 || type == GgmlType::Q4_K) std::memcpy(&w[o + 2], &h, 2);
    }
  }
  if (tiles) {
    if (!weight_tiles_type(type) || rows % kWeightTileRows != 0) {
      std::fprintf(stderr, "tiles: Q4_0, Q4_1, Q5_0, Q8_0, Q4_K or Q6_K with rows a multiple of 16\n");
      return 2;
    }
    pack_weight_tiles(type, w, rows, cols);
  }
  std::printf("# %s %s, %lld x %lld (%.2f MB of weights, %s, %s pages, offset %zu), one thread, best of %d\n",
              level.c_str(), tname.c_str(), static_cast<long long>(rows), static_cast<long long>(cols), w_bytes / 1e6,
              tiles ? "tiles" : "rows", advised ? "huge" : "plain", w_offset, reps);
  // A plain read of as many bytes (at least 1 MiB) on one thread: what the rows could stream at.
  const double read_bps = measure_read_bandwidth(1, std::max<size_t>(w_bytes, size_t{1} << 20), reps);
  std::printf("plain read      %7.2f GB/s of weights\n", read_bps / 1e9);
  // argv[7]: one activation-row count instead of the list.
  std::vector<int> counts = {1, 2, 4, 8, 16, 32};
  if (argc > 7) counts = {std::atoi(argv[7])};
  for (const int T : counts) {
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
      if (tiles) k.dot_q_tiles(type, w, rows / kWeightTileRows, a.data(), nb, T, cols, out.data(), rows);
      for (int64_t r0 = 0; !tiles && r0 < rows; r0 += kMaxRows) {
        const int R = static_cast<int>(std::min<int64_t>(kMaxRows, rows - r0));
        const void* wp[kMaxRows];
        float* op[kMaxRows];
        for (int r = 0; r < R; ++r) {
          wp[r] = w + (r0 + r) * rb;
          op[r] = out.data() + r0 + r;
        }
        k.dot_q_rows(type, wp, R, a.data(), nb, T, cols, op, rows);
      }
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    const double macs = static_cast<double>(rows) * cols * T;
    std::printf("T=%-3d %8.4f ns/MAC  %7.2f GB/s of weights  %8.3f ms\n", T, best * 1e9 / macs, w_bytes / best / 1e9,
                best * 1e3);
  }
  return 0;
}
