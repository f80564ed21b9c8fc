#include "kv_transfer.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace kvs {

namespace {

constexpr uint64_t kMulA = 0x9E3779B185EBCA87ull;  // odd 64-bit constants with well-mixed bits
constexpr uint64_t kMulB = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t kMulTail = 0x100000001B3ull;  // FNV-1a prime, for the byte tail
constexpr int kFormats = 5;                      // KvFormat values are [0, kFormats)

inline uint64_t rotl(uint64_t x, int r) {
  return (x << r) | (x >> (64 - r));
}

inline uint64_t load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

bool is_sliding(const ModelConfig& c, int layer) {
  return !c.layer_swa.empty() && c.layer_swa[layer] != 0;
}

// First position a sliding layer keeps for a sequence with n_past positions (0 without sliding layers).
int window_start(const ModelConfig& c, int n_past) {
  return c.n_layer_swa > 0 ? std::max(0, n_past - c.sliding_window + 1) : 0;
}

std::string where(const char* fn) {
  return std::string(fn) + ": ";
}

// a * b, throwing when the product does not fit in 64 bits (sizes computed from an untrusted header).
uint64_t mul_checked(uint64_t a, uint64_t b, const char* what) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) {
    throw std::invalid_argument(std::string("import_kv: the snapshot's ") + what + " overflows; the blob is corrupt");
  }
  return r;
}

uint64_t add_checked(uint64_t a, uint64_t b, const char* what) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) {
    throw std::invalid_argument(std::string("import_kv: the snapshot's ") + what + " overflows; the blob is corrupt");
  }
  return r;
}

// Payload bytes for the given geometry, formats and counts (64-bit, overflow-checked).
uint64_t payload_size(const uint8_t* layer_swa, uint64_t n_layer, uint64_t n_head_kv, uint64_t k_row, uint64_t v_row,
                      uint64_t n_past, uint64_t swa_from) {
  const uint64_t per_pos = mul_checked(n_head_kv, add_checked(k_row, v_row, "row size"), "row size");
  uint64_t total = 0;
  for (uint64_t l = 0; l < n_layer; ++l) {
    const uint64_t positions = layer_swa[l] ? n_past - swa_from : n_past;
    total = add_checked(total, mul_checked(positions, per_pos, "payload size"), "payload size");
  }
  return total;
}

// Calls fn(layer, is_k, p0, cnt, row) for each run of cnt consecutive positions from p0 inside
// one block (row: the first one's bytes, cnt rows of kv_row_bytes), in the snapshot's row order.
// A tiled pool's keys and values (kv_format.h) pass through a copy in row layout: read from the tiles before
// fn, and when `writes`, the rows fn changed written back after it (rows it leaves alone, such as
// those held through prefix sharing, are not written).
template <typename Fn>
void for_each_run(const ModelConfig& c, const KvPool* kv, const KvPool* swa_kv, const std::vector<int>& blocks,
                  const std::vector<int>& swa_blocks, int n_past, int swa_from, const KvBlockBytes& block_bytes,
                  bool writes, Fn&& fn) {
  std::vector<uint8_t> rows, was;  // a tiled run's rows in row layout: as fn sees them, as they were
  for (int l = 0; l < c.n_layer; ++l) {
    const bool swa = is_sliding(c, l);
    const KvPool& pool = swa ? *swa_kv : *kv;
    const std::vector<int>& table = swa ? swa_blocks : blocks;
    const int bt = pool.geometry().block_tokens;
    const int kl = c.layer_kv_index[l];
    const int from = swa ? swa_from : 0;
    for (int part = 0; part < 2; ++part) {
      for (int h = 0; h < c.n_head_kv; ++h) {
        for (int p = from, cnt; p < n_past; p += cnt) {
          const int off = p % bt;
          cnt = std::min(bt - off, n_past - p);
          const size_t bi = static_cast<size_t>(p / bt);
          if (bi >= table.size() || table[bi] < 0) {
            throw std::runtime_error("KV snapshot: position " + std::to_string(p) + " of layer " + std::to_string(l) +
                                     " has no block (internal error: the block table does not cover it)");
          }
          uint8_t* row;
          if (block_bytes) {
            row = block_bytes(swa, table[bi]) +
                  (part == 0 ? pool.k_row_offset(kl, off, h) : pool.v_row_offset(kl, off, h));
          } else if (part == 0 ? pool.k_tiled() : pool.v_tiled()) {
            const size_t rb = part == 0 ? pool.k_row_bytes() : pool.v_row_bytes();
            rows.resize(static_cast<size_t>(cnt) * rb);
            for (int j = 0; j < cnt; ++j) pool.get_row(part, table[bi], kl, off + j, h, rows.data() + j * rb);
            if (!writes) {
              fn(l, part == 0, p, cnt, rows.data());
              continue;
            }
            was = rows;
            fn(l, part == 0, p, cnt, rows.data());
            for (int j = 0; j < cnt; ++j) {
              if (std::memcmp(rows.data() + j * rb, was.data() + j * rb, rb) != 0) {
                pool.put_row(part, table[bi], kl, off + j, h, rows.data() + j * rb);
              }
            }
            continue;
          } else {
            row = part == 0 ? pool.k_row(table[bi], kl, off, h) : pool.v_row(table[bi], kl, off, h);
          }
          fn(l, part == 0, p, cnt, row);
        }
      }
    }
  }
}

KvSnapshotHeader make_header(const KvSnapshotSource& src) {
  const ModelConfig& c = *src.config;
  const KvGeometry& g = src.kv->geometry();
  KvSnapshotHeader h;
  std::memset(&h, 0, sizeof h);
  std::memcpy(h.magic, kKvSnapshotMagic, sizeof h.magic);
  h.version = kKvSnapshotVersion;
  h.header_bytes = sizeof(KvSnapshotHeader);
  std::memcpy(h.arch, c.arch.data(), std::min(c.arch.size(), sizeof h.arch - 1));
  h.n_layer = static_cast<uint32_t>(c.n_layer);
  h.n_head_kv = static_cast<uint32_t>(c.n_head_kv);
  h.head_dim = static_cast<uint32_t>(c.head_dim);
  h.n_embd = static_cast<uint32_t>(c.n_embd);
  h.n_vocab = static_cast<uint32_t>(c.n_vocab);
  h.sliding_window = static_cast<uint32_t>(c.sliding_window);
  h.k_format = static_cast<uint32_t>(g.k_format);
  h.v_format = static_cast<uint32_t>(g.v_format);
  h.n_past = static_cast<uint32_t>(src.n_past);
  h.n_tokens = static_cast<uint32_t>(src.tokens->size());
  h.swa_from = static_cast<uint32_t>(window_start(c, src.n_past));
  h.flags = src.lazy_tail ? kKvSnapshotLazyTail : 0u;
  std::vector<uint8_t> layer_swa(c.n_layer);
  for (int l = 0; l < c.n_layer; ++l) layer_swa[l] = is_sliding(c, l) ? 1 : 0;
  h.payload_bytes = payload_size(layer_swa.data(), h.n_layer, h.n_head_kv, src.kv->k_row_bytes(), src.kv->v_row_bytes(),
                                 h.n_past, h.swa_from);
  return h;
}

}  // namespace

uint64_t kv_snapshot_checksum(const uint8_t* data, size_t n) {
  uint64_t lane[4] = {kMulA + kMulB, kMulB, 0, 0 - kMulA};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int j = 0; j < 4; ++j) lane[j] = rotl(lane[j] + load64(data + i + 8 * j) * kMulB, 31) * kMulA;
  }
  uint64_t h = static_cast<uint64_t>(n) * kMulA;
  for (int j = 0; j < 4; ++j) h = rotl(h ^ (rotl(lane[j] * kMulB, 31) * kMulA), 27) * kMulA + kMulB;
  for (; i < n; ++i) h = (h ^ data[i]) * kMulTail;
  h ^= h >> 33;  // final mix: every input bit reaches every output bit
  h *= kMulB;
  h ^= h >> 29;
  h *= kMulA;
  h ^= h >> 32;
  return h;
}

size_t kv_snapshot_bytes(const KvSnapshotSource& src) {
  const KvSnapshotHeader h = make_header(src);
  return sizeof(KvSnapshotHeader) + static_cast<size_t>(h.n_layer) + sizeof(int32_t) * src.tokens->size() +
         static_cast<size_t>(h.payload_bytes) + sizeof(uint64_t);
}

std::string write_kv_snapshot(const KvSnapshotSource& src) {
  const ModelConfig& c = *src.config;
  const KvSnapshotHeader h = make_header(src);
  std::string out(kv_snapshot_bytes(src), '\0');
  auto* base = reinterpret_cast<uint8_t*>(&out[0]);
  uint8_t* w = base;
  std::memcpy(w, &h, sizeof h);
  w += sizeof h;
  for (int l = 0; l < c.n_layer; ++l) *w++ = is_sliding(c, l) ? 1 : 0;
  if (!src.tokens->empty()) std::memcpy(w, src.tokens->data(), sizeof(int32_t) * src.tokens->size());
  w += sizeof(int32_t) * src.tokens->size();
  const size_t k_row = src.kv->k_row_bytes(), v_row = src.kv->v_row_bytes();
  static const std::vector<int> no_blocks;
  const std::vector<int>& swa_blocks = src.swa_blocks != nullptr ? *src.swa_blocks : no_blocks;
  for_each_run(c, src.kv, src.swa_kv, *src.blocks, swa_blocks, src.n_past, static_cast<int>(h.swa_from),
               src.block_bytes, false, [&](int, bool is_k, int, int cnt, const uint8_t* row) {
                 const size_t bytes = static_cast<size_t>(cnt) * (is_k ? k_row : v_row);
                 std::memcpy(w, row, bytes);
                 w += bytes;
               });
  if (static_cast<size_t>(w - base) + sizeof(uint64_t) != out.size()) {
    throw std::runtime_error("export_kv: wrote " + std::to_string(w - base) + " bytes, expected " +
                             std::to_string(out.size() - sizeof(uint64_t)) + " (internal error)");
  }
  const uint64_t sum = kv_snapshot_checksum(base, out.size() - sizeof(uint64_t));
  std::memcpy(w, &sum, sizeof sum);
  return out;
}

KvSnapshot read_kv_snapshot(const uint8_t* data, size_t n, const ModelConfig& c) {
  const std::string fn = where("import_kv");
  if (n < sizeof(KvSnapshotHeader)) {
    throw std::invalid_argument(fn + "the blob is " + std::to_string(n) + " bytes, shorter than the " +
                                std::to_string(sizeof(KvSnapshotHeader)) +
                                "-byte snapshot header; it is truncated or not a KV snapshot (Engine.export_kv)");
  }
  KvSnapshotHeader h;
  std::memcpy(&h, data, sizeof h);
  if (std::memcmp(h.magic, kKvSnapshotMagic, sizeof h.magic) != 0) {
    throw std::invalid_argument(fn +
                                "not a KV snapshot (its first 8 bytes are not \"KVSWSNAP\"); pass the bytes "
                                "Engine.export_kv returned");
  }
  if (h.version != kKvSnapshotVersion) {
    throw std::invalid_argument(fn + "KV snapshot version " + std::to_string(h.version) +
                                ", this engine reads version " + std::to_string(kKvSnapshotVersion) +
                                "; export it again with this build, or re-prefill the session from its tokens");
  }
  if (h.header_bytes != sizeof(KvSnapshotHeader)) {
    throw std::invalid_argument(fn + "the snapshot header says it is " + std::to_string(h.header_bytes) +
                                " bytes, version " + std::to_string(kKvSnapshotVersion) + " headers are " +
                                std::to_string(sizeof(KvSnapshotHeader)) + "; the blob is corrupt");
  }
  if (h.k_format >= kFormats || h.v_format >= kFormats) {
    throw std::invalid_argument(fn + "the snapshot names KV formats " + std::to_string(h.k_format) + "/" +
                                std::to_string(h.v_format) + ", known formats are 0.." + std::to_string(kFormats - 1) +
                                "; the blob is corrupt");
  }
  const KvFormat kf = static_cast<KvFormat>(h.k_format), vf = static_cast<KvFormat>(h.v_format);
  if (h.n_past > h.n_tokens) {
    throw std::invalid_argument(fn + "the snapshot has KV for " + std::to_string(h.n_past) + " positions but only " +
                                std::to_string(h.n_tokens) + " tokens; the blob is corrupt");
  }
  // Sizes first (a truncated blob), then the checksum (a flipped byte), then the model (another model's blob).
  const size_t after_header = n - sizeof(KvSnapshotHeader);
  if (h.n_layer > after_header) {
    throw std::invalid_argument(fn + "the blob is " + std::to_string(n) + " bytes, too short for its " +
                                std::to_string(h.n_layer) + "-layer table; it is truncated");
  }
  const uint8_t* layer_swa = data + sizeof(KvSnapshotHeader);
  uint64_t swa_layers = 0;
  for (uint32_t l = 0; l < h.n_layer; ++l) {
    if (layer_swa[l] > 1) throw std::invalid_argument(fn + "the snapshot's layer table is corrupt");
    swa_layers += layer_swa[l];
  }
  if (h.swa_from > h.n_past) throw std::invalid_argument(fn + "the snapshot's window start is past its KV; corrupt");
  uint64_t k_row = 0, v_row = 0;
  try {
    k_row = kv_row_bytes(kf, static_cast<int>(std::min<uint32_t>(h.head_dim, 1u << 20)));
    v_row = kv_row_bytes(vf, static_cast<int>(std::min<uint32_t>(h.head_dim, 1u << 20)));
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fn + "the snapshot's head_dim " + std::to_string(h.head_dim) + " does not fit its " +
                                "KV formats (" + e.what() + "); the blob is corrupt");
  }
  if (h.head_dim > (1u << 20)) throw std::invalid_argument(fn + "the snapshot's head_dim is corrupt");
  const uint64_t payload =
      payload_size(layer_swa, h.n_layer, h.n_head_kv, k_row, v_row, h.n_past, swa_layers ? h.swa_from : 0);
  uint64_t expected = add_checked(sizeof(KvSnapshotHeader), h.n_layer, "size");
  expected = add_checked(expected, mul_checked(sizeof(int32_t), h.n_tokens, "token count"), "size");
  expected = add_checked(expected, payload, "size");
  expected = add_checked(expected, sizeof(uint64_t), "size");
  if (payload != h.payload_bytes || expected != n) {
    throw std::invalid_argument(fn + "the blob is " + std::to_string(n) + " bytes, its header describes " +
                                std::to_string(expected) + " (" + std::to_string(payload) +
                                " bytes of K/V rows, header field " + std::to_string(h.payload_bytes) +
                                "); it is truncated or corrupt");
  }
  uint64_t stored;
  std::memcpy(&stored, data + n - sizeof stored, sizeof stored);
  if (kv_snapshot_checksum(data, n - sizeof stored) != stored) {
    throw std::invalid_argument(fn +
                                "the snapshot's checksum does not match its bytes; the blob is corrupt "
                                "(re-prefill the session from its tokens)");
  }

  // The model: every mismatch is named.
  std::string mismatch;
  auto check = [&](const char* field, uint64_t have, uint64_t want) {
    if (have != want && mismatch.empty()) {
      mismatch = std::string(field) + " " + std::to_string(have) + " in the snapshot, " + std::to_string(want) +
                 " in this model";
    }
  };
  const std::string arch(h.arch, strnlen(h.arch, sizeof h.arch));
  const std::string want_arch = c.arch.substr(0, sizeof h.arch - 1);
  if (arch != want_arch) mismatch = "arch '" + arch + "' in the snapshot, '" + want_arch + "' in this model";
  check("n_layer", h.n_layer, c.n_layer);
  check("n_head_kv", h.n_head_kv, c.n_head_kv);
  check("head_dim", h.head_dim, c.head_dim);
  check("n_embd", h.n_embd, c.n_embd);
  check("n_vocab", h.n_vocab, c.n_vocab);
  check("sliding_window", h.sliding_window, c.sliding_window);
  for (int l = 0; mismatch.empty() && l < c.n_layer; ++l) {
    if (layer_swa[l] != (is_sliding(c, l) ? 1 : 0)) {
      mismatch = "layer " + std::to_string(l) + (layer_swa[l] ? " slides" : " is global") +
                 " in the snapshot, not in this model";
    }
  }
  if (!mismatch.empty()) {
    throw std::invalid_argument(fn + "the snapshot is of another model (" + mismatch +
                                "); import it on a worker running the model it was exported from");
  }
  if (h.n_tokens > static_cast<uint32_t>(c.n_ctx_train)) {
    throw std::invalid_argument(fn + "the snapshot holds " + std::to_string(h.n_tokens) + " tokens, more than the " +
                                std::to_string(c.n_ctx_train) + "-token context of this model");
  }
  if (h.swa_from != static_cast<uint32_t>(window_start(c, static_cast<int>(h.n_past)))) {
    throw std::invalid_argument(fn + "the snapshot's sliding window starts at position " + std::to_string(h.swa_from) +
                                ", expected " + std::to_string(window_start(c, static_cast<int>(h.n_past))) + " for " +
                                std::to_string(h.n_past) + " positions; the blob is corrupt");
  }
  if ((h.flags & ~kKvSnapshotLazyTail) != 0) {
    throw std::invalid_argument(fn + "the snapshot has unknown flags " + std::to_string(h.flags) +
                                "; it was written by a newer build");
  }
  const bool lazy_tail = (h.flags & kKvSnapshotLazyTail) != 0;
  if (lazy_tail && h.n_past + 1 != h.n_tokens) {
    throw std::invalid_argument(fn + "the snapshot marks a lazy tail but has " + std::to_string(h.n_tokens - h.n_past) +
                                " tokens without KV; the blob is corrupt");
  }

  KvSnapshot s;
  s.k_format = kf;
  s.v_format = vf;
  s.n_past = static_cast<int>(h.n_past);
  s.swa_from = static_cast<int>(h.swa_from);
  s.lazy_tail = lazy_tail;
  const uint8_t* tok = layer_swa + h.n_layer;
  s.tokens.resize(h.n_tokens);
  if (h.n_tokens > 0) std::memcpy(s.tokens.data(), tok, sizeof(int32_t) * h.n_tokens);
  s.rows = tok + sizeof(int32_t) * h.n_tokens;
  s.payload_bytes = static_cast<size_t>(payload);
  return s;
}

void write_kv_snapshot_rows(const KvSnapshot& snap, const ModelConfig& c, KvPool& kv, KvPool* swa_kv,
                            const std::vector<int>& blocks, const std::vector<int>& swa_blocks, int skip_before,
                            const Kernels& kern, const KvBlockBytes& block_bytes) {
  const int hd = c.head_dim;
  const size_t src_k = kv_row_bytes(snap.k_format, hd), src_v = kv_row_bytes(snap.v_format, hd);
  const KvFormat dst_kf = kv.geometry().k_format, dst_vf = kv.geometry().v_format;
  const size_t dst_k = kv.k_row_bytes(), dst_v = kv.v_row_bytes();
  std::vector<float> row(hd);  // (head_dim,) one row decoded to f32 for a conversion
  const uint8_t* r = snap.rows;
  for_each_run(c, &kv, swa_kv, blocks, swa_blocks, snap.n_past, snap.swa_from, block_bytes, true,
               [&](int layer, bool is_k, int p0, int cnt, uint8_t* dst) {
                 const KvFormat sf = is_k ? snap.k_format : snap.v_format;
                 const KvFormat df = is_k ? dst_kf : dst_vf;
                 const size_t sb = is_k ? src_k : src_v, db = is_k ? dst_k : dst_v;
                 const uint8_t* src = r;
                 r += static_cast<size_t>(cnt) * sb;
                 // Global rows before skip_before are held through prefix sharing (never written again).
                 int skip = 0;
                 if (!is_sliding(c, layer)) skip = std::clamp(skip_before - p0, 0, cnt);
                 if (sf == df) {
                   std::memcpy(dst + skip * db, src + skip * sb, static_cast<size_t>(cnt - skip) * sb);
                   return;
                 }
                 for (int j = skip; j < cnt; ++j) {
                   kern.kv_load_row(sf, src + j * sb, row.data(), hd);
                   kv_store_row(df, row.data(), dst + j * db, hd);
                 }
               });
  if (static_cast<size_t>(r - snap.rows) != snap.payload_bytes) {
    throw std::runtime_error("import_kv: read " + std::to_string(r - snap.rows) + " row bytes, expected " +
                             std::to_string(snap.payload_bytes) + " (internal error)");
  }
}

}  // namespace kvs
