// Engine test driver for the sanitizer build (KVS_SANITIZE=ON: AddressSanitizer
// + UndefinedBehaviorSanitizer). For each GGUF path on the command line it opens
// the model, and when that succeeds runs every KV format through prefill,
// batched decode, multi-turn append, prefix sharing, a KV budget that runs out,
// a budget move and scoring. A file that is rejected must be rejected with an
// exception, never a crash or a sanitizer report. Before the files, it checks the
// host KV pool's slab layout. Prints "N loaded, M rejected".
#include "../engine.h"

#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "../kv_cache.h"

using kvs::Engine;
using kvs::EngineOptions;
using kvs::SamplingParams;

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("FAIL %s\n", what.c_str());
    ++failures;
  }
}

void exercise(const std::string& path, const std::string& kv_k, const std::string& kv_v) {
  EngineOptions opt;
  opt.model_path = path;
  opt.kv_k = kv_k;
  opt.kv_v = kv_v;
  opt.threads = 2;
  opt.block_tokens = 4;
  opt.max_batch_tokens = 8;  // small, so prompts are prefilled in several chunks
  Engine e(opt);
  const int vocab = static_cast<int>(e.config().n_vocab);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 19; ++i) prompt.push_back((7 * i + 3) % vocab);
  SamplingParams greedy;
  greedy.max_new_tokens = 6;
  SamplingParams hot = greedy;
  hot.temperature = 0.9f;
  hot.top_k = 5;
  hot.top_p = 0.8f;
  hot.repetition_penalty = 1.2f;
  hot.seed = 11;
  int a = e.add_sequence(prompt, greedy, true);
  int b = e.add_sequence(prompt, hot, true);  // shares a's full prefix blocks
  std::vector<int32_t> other(prompt.rbegin(), prompt.rend());
  int c = e.add_sequence(other, greedy, true);
  int steps = 0;
  while (e.busy() && steps < 200) {
    e.step();
    ++steps;
  }
  expect(!e.busy(), path + " " + kv_k + "/" + kv_v + ": sequences finish");
  e.append(a, {1, 2, 3}, greedy, true);  // a second turn keeps the history's KV
  while (e.busy() && steps < 400) {
    e.step();
    ++steps;
  }
  expect(e.info(a).n_tokens > static_cast<int>(prompt.size()) + 3, "append extends the history");
  std::vector<float> logits = e.score(c, {5, 6});
  // One row per token fed: the two given, after any the sequence still had queued (its last sampled one).
  expect(logits.size() % vocab == 0 && logits.size() / vocab >= 2 && logits.size() / vocab <= 3,
         "score returns a row per token");
  e.free(b);
  e.free(a);
  e.free(c);
  // A budget of a few blocks runs out mid-prefill: the sequence stops with "kv_budget", nothing breaks.
  e.set_kv_budget(e.memory().block_bytes * 3);
  int d = e.add_sequence(prompt, greedy, true);
  while (e.busy() && steps < 600) {
    e.step();
    ++steps;
  }
  expect(e.info(d).finish_reason == "kv_budget", "a small budget ends the sequence with kv_budget");
  e.free(d);
  e.set_kv_budget(0);
}

// The host pool's slab layout (kv_cache.h): every row of every block has bytes of its own (each row is
// stamped with its own number, then every stamp is read back), and within a slab the runs of one
// (layer, kv head) of blocks taken one after another are adjacent, K and V alike.
void pool_layout() {
  kvs::KvGeometry g;
  g.n_layer = 3;
  g.n_kv_head = 2;
  g.head_dim = 64;
  g.k_format = kvs::KvFormat::Q8_0;  // 68-byte rows
  g.v_format = kvs::KvFormat::F16;   // 128-byte rows
  g.block_tokens = 4;
  kvs::KvPool pool(g, 0);
  // 4,704-byte blocks: 4,000 of them span two slabs (~8 MiB each, rounded up to whole 2 MiB pages)
  const int n = 4000;
  std::vector<int> ids;
  for (int i = 0; i < n; ++i) ids.push_back(pool.acquire());
  auto each_row = [&](auto&& fn) {
    uint32_t stamp = 0;
    for (int b : ids) {
      for (int l = 0; l < g.n_layer; ++l) {
        for (int h = 0; h < g.n_kv_head; ++h) {
          for (int s = 0; s < g.block_tokens; ++s) {
            fn(pool.k_row(b, l, s, h), pool.k_row_bytes(), stamp++);
            fn(pool.v_row(b, l, s, h), pool.v_row_bytes(), stamp++);
          }
        }
      }
    }
  };
  each_row([](uint8_t* row, size_t bytes, uint32_t stamp) {
    for (size_t o = 0; o + sizeof stamp <= bytes; o += sizeof stamp) std::memcpy(row + o, &stamp, sizeof stamp);
  });
  bool intact = true;
  each_row([&](uint8_t* row, size_t bytes, uint32_t stamp) {
    for (size_t o = 0; o + sizeof stamp <= bytes; o += sizeof stamp)
      intact = intact && std::memcmp(row + o, &stamp, sizeof stamp) == 0;
  });
  expect(intact, "KV pool: every row keeps its own bytes");
  // Pairs of consecutive blocks whose runs are not adjacent: only where a slab ends.
  int apart = 0;
  for (int i = 0; i + 1 < n; ++i) {
    bool adjacent = true;
    for (int l = 0; l < g.n_layer; ++l) {
      for (int h = 0; h < g.n_kv_head; ++h) {
        adjacent = adjacent && pool.k_row(ids[i + 1], l, 0, h) == pool.k_row(ids[i], l, g.block_tokens, h) &&
                   pool.v_row(ids[i + 1], l, 0, h) == pool.v_row(ids[i], l, g.block_tokens, h);
      }
    }
    apart += adjacent ? 0 : 1;
  }
  const size_t slab_blocks = (size_t{8} << 20) / pool.block_bytes();  // at least this many per slab
  expect(apart > 0 && static_cast<size_t>(apart) <= (n + slab_blocks - 1) / slab_blocks - 1,
         "KV pool: consecutive blocks' runs are adjacent inside a slab (" + std::to_string(apart) + " breaks)");
}

}  // namespace

int main(int argc, char** argv) {
  pool_layout();
  int loaded = 0;
  int rejected = 0;
  const char* formats[][2] = {{"f32", "f32"}, {"f16", "q8_0"}, {"q8_head", "q4_0"}, {"q4_0", "q8_head"}};
  for (int i = 1; i < argc; ++i) {
    const std::string path = argv[i];
    try {
      for (auto& f : formats) exercise(path, f[0], f[1]);
      ++loaded;
    } catch (const std::exception& ex) {
      ++rejected;
    }
  }
  std::printf("%d loaded, %d rejected, %d failed\n", loaded, rejected, failures);
  return failures == 0 ? 0 : 1;
}
