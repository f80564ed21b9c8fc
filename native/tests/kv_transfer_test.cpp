// KV snapshot driver for the sanitizer build (KVS_SANITIZE=ON): for each GGUF
// path on the command line, exports sequences in several KV formats, imports
// them (same format, converted, another block_tokens), then imports damaged
// copies: every cut length near the sections' edges, byte flips, and header
// fields and tokens set to extremes WITH a recomputed checksum (so the checks
// after the checksum run too). Every damaged blob must be refused with
// std::invalid_argument, never a crash or a sanitizer report.
// Prints "N imported, M rejected, F failed".
#include "../kv_transfer.h"

#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "../engine.h"

using kvs::Engine;
using kvs::EngineOptions;
using kvs::SamplingParams;

namespace {

int failures = 0, imported = 0, rejected = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("FAIL %s\n", what.c_str());
    ++failures;
  }
}

EngineOptions options(const std::string& path, const std::string& k, const std::string& v, int block_tokens) {
  EngineOptions o;
  o.model_path = path;
  o.kv_k = k;
  o.kv_v = v;
  o.threads = 2;
  o.block_tokens = block_tokens;
  o.max_batch_tokens = 16;
  return o;
}

// Restores the checksum over a changed blob (kv_transfer.h: the last 8 bytes).
void reseal(std::string& blob) {
  if (blob.size() < 8) return;
  const uint64_t sum =
      kvs::kv_snapshot_checksum(reinterpret_cast<const uint8_t*>(blob.data()), blob.size() - sizeof(uint64_t));
  std::memcpy(&blob[blob.size() - 8], &sum, sizeof sum);
}

void expect_refused(Engine& e, const std::string& blob, const std::string& what) {
  try {
    e.import_kv(blob, SamplingParams{}, false);
    expect(false, what + ": accepted");
  } catch (const std::invalid_argument&) {
    ++rejected;
  } catch (const std::exception& ex) {
    expect(false, what + ": wrong exception: " + ex.what());
  }
}

void exercise(const std::string& path, const std::string& k, const std::string& v) {
  Engine src(options(path, k, v, 16));
  const int vocab = src.config().n_vocab;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 41; ++i) prompt.push_back((11 * i + 5) % vocab);
  SamplingParams greedy;
  greedy.max_new_tokens = 5;
  const int id = src.add_sequence(prompt, greedy, true);
  for (int i = 0; i < 100 && src.busy(); ++i) src.step();
  const std::string blob = src.export_kv(id);
  expect(blob.size() == src.kv_export_bytes(id), path + ": kv_export_bytes");
  const std::string tag = path + " " + k + "/" + v;

  for (const char* dst_fmt : {"same", "q8_0", "f32"}) {
    const std::string dk = std::string(dst_fmt) == "same" ? k : dst_fmt;
    const std::string dv = std::string(dst_fmt) == "same" ? v : dst_fmt;
    Engine dst(options(path, dk, dv, 5));
    const int got = dst.import_kv(blob, greedy, false);
    ++imported;
    expect(dst.tokens(got) == src.tokens(id), tag + " -> " + dk + "/" + dv + ": tokens");
    dst.append(got, {1, 2, 3}, greedy, true);
    for (int i = 0; i < 100 && dst.busy(); ++i) dst.step();
    expect(!dst.busy(), tag + ": the imported sequence continues");
    const std::string again = dst.export_kv(got);  // a converted sequence exports in its own format
    Engine back(options(path, dk, dv, 16));
    back.import_kv(again, greedy, false);
    ++imported;
  }

  Engine dst(options(path, k, v, 16));
  const size_t n = blob.size();
  const size_t header = sizeof(kvs::KvSnapshotHeader);
  std::vector<size_t> cuts = {0, 1, 8, 12, header - 1, header, header + 1, n / 2, n - 9, n - 8, n - 1};
  for (size_t c = header; c < std::min(n, header + 400); c += 7) cuts.push_back(c);
  for (size_t c : cuts) expect_refused(dst, blob.substr(0, c), tag + ": cut at " + std::to_string(c));
  expect_refused(dst, blob + std::string(3, '\0'), tag + ": trailing bytes");
  for (size_t pos = 0; pos < n; pos += 97) {
    std::string bad = blob;
    bad[pos] = static_cast<char>(bad[pos] ^ 0x41);
    expect_refused(dst, bad, tag + ": flip at " + std::to_string(pos));
  }
  // 32-bit header fields after the magic (version .. flags, and both halves of payload_bytes),
  // set to extremes with a valid checksum.
  const uint32_t extremes[] = {0u, 1u, 2u, 3u, 5u, 31u, 0x7fffffffu, 0x80000000u, 0xffffffffu};
  for (size_t field = 2; field < header / 4; ++field) {
    if (field >= 4 && field < 8) continue;  // the arch name: checked below
    for (uint32_t x : extremes) {
      std::string bad = blob;
      uint32_t old;
      std::memcpy(&old, &bad[4 * field], 4);
      if (old == x) continue;
      std::memcpy(&bad[4 * field], &x, 4);
      reseal(bad);
      // NOTE: flags 0 is valid too (the pending last token is then queued instead of lazy).
      if (field == 19 && x == 0) continue;
      expect_refused(dst, bad, tag + ": header field " + std::to_string(field) + " = " + std::to_string(x));
    }
  }
  {
    std::string bad = blob;
    std::memcpy(&bad[16], "gemma9", 7);
    reseal(bad);
    expect_refused(dst, bad, tag + ": another arch");
  }
  for (int32_t t : {-1, vocab, 0x7fffffff}) {  // a token outside the vocabulary
    std::string bad = blob;
    const size_t at = header + static_cast<size_t>(src.config().n_layer) + 4 * 3;
    std::memcpy(&bad[at], &t, 4);
    reseal(bad);
    expect_refused(dst, bad, tag + ": token " + std::to_string(t));
  }
  {
    std::string bad = blob;
    bad[header] = 7;  // the layer table holds 0 or 1
    reseal(bad);
    expect_refused(dst, bad, tag + ": layer table");
  }
  expect(dst.memory().blocks_in_use == 0 && dst.sequence_ids().empty(), tag + ": refused imports hold nothing");
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string path = argv[i];
    for (const auto& kv : std::vector<std::pair<std::string, std::string>>{
             {"f16", "f16"}, {"q8_0", "q4_0"}, {"q8_head", "f32"}, {"q4_0", "q8_0"}}) {
      try {
        exercise(path, kv.first, kv.second);
      } catch (const std::exception& e) {
        expect(false, path + " " + kv.first + "/" + kv.second + ": " + e.what());
      }
    }
  }
  std::printf("%d imported, %d rejected, %d failed\n", imported, rejected, failures);
  return failures == 0 ? 0 : 1;
}
