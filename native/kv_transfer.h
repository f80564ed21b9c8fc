// KV snapshots: one sequence's token history and K/V rows as a self-describing
// byte string (Engine::export_kv / import_kv), so a session can be parked to
// host memory or disk, or shipped to another worker, and resume without a
// re-prefill.
//
// Blob format, version 1. Every integer is little-endian; there is no padding
// between sections.
//
//   offset  bytes              field
//   0       88                 KvSnapshotHeader (below)
//   88      n_layer            layer_swa: uint8 per model layer, 1 = sliding-window layer
//   ..      4 * n_tokens       tokens: int32, the whole history (prompt, turns, sampled tokens,
//                              including those without KV yet: a lazy tail or queued prefill)
//   ..      payload_bytes      K/V rows (below)
//   end-8   8                  checksum: uint64 kv_snapshot_checksum of every byte before it
//
// K/V rows, in this order (position order, never block order, so the
// destination may use another block_tokens):
//   for layer l in [0, n_layer):                 model layer order
//     positions [from_l, n_past): from_l = 0 for a global layer,
//                                 swa_from for a sliding layer
//     for part in (K, V):
//       for kv head h in [0, n_head_kv):
//         for position p in [from_l, n_past):
//           one row: kv_row_bytes(part == K ? k_format : v_format, head_dim) bytes,
//                    the pool's own row bytes (kv_format.h), so a same-format
//                    import is bit-exact
//   payload_bytes = sum_l (n_past - from_l) * n_head_kv * (k_row_bytes + v_row_bytes)
//
// swa_from = max(0, n_past - W + 1) for a model with sliding window W (0 without
// one): the positions the next token (at n_past) attends to in a sliding layer.
//
// NOTE: what a snapshot does not carry: the sampling parameters and RNG state
// (the importer passes its own SamplingParams; a seeded sampler restarts from
// its seed, greedy is unaffected), the token mask and the turn's generated
// count. A sequence holding fill_kv's synthetic rows cannot be exported.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "kv_cache.h"
#include "model.h"

namespace kvs {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "KV snapshots are written as little-endian host bytes");

constexpr char kKvSnapshotMagic[8] = {'K', 'V', 'S', 'W', 'S', 'N', 'A', 'P'};
constexpr uint32_t kKvSnapshotVersion = 1;
constexpr uint32_t kKvSnapshotLazyTail = 1u;  // flags bit 0: the last token was sampled after its turn ended

struct KvSnapshotHeader {
  char magic[8];            // kKvSnapshotMagic
  uint32_t version;         // kKvSnapshotVersion
  uint32_t header_bytes;    // sizeof(KvSnapshotHeader)
  char arch[16];            // general.architecture, NUL-padded (cut at 15 characters)
  uint32_t n_layer;         // model layers (global and sliding)
  uint32_t n_head_kv;       // KV heads of every layer
  uint32_t head_dim;        // elements per K/V row
  uint32_t n_embd;          // model width (identity check only)
  uint32_t n_vocab;         // vocabulary size (identity check only)
  uint32_t sliding_window;  // W; 0: no sliding layers
  uint32_t k_format;        // KvFormat of the K rows
  uint32_t v_format;        // KvFormat of the V rows
  uint32_t n_past;          // positions with KV: tokens[0, n_past)
  uint32_t n_tokens;        // history length, >= n_past
  uint32_t swa_from;        // first position stored for sliding layers
  uint32_t flags;           // kKvSnapshotLazyTail
  uint64_t payload_bytes;   // bytes of the K/V rows section
};
static_assert(sizeof(KvSnapshotHeader) == 88, "KvSnapshotHeader must be 88 bytes");

// Cheap 64-bit checksum (four multiply-rotate lanes over 32-byte stripes, a byte
// tail, a final mix): catches flipped and truncated bytes, not an adversary.
uint64_t kv_snapshot_checksum(const uint8_t* data, size_t n);

// The bytes of block `block` of the global pool (swa false) or the sliding pool (swa true), laid
// out as kv_cache.h says. Empty: the pools' own host storage (KvPool::k_row). A device engine
// passes host copies of its device blocks (DeviceForward::host_block).
using KvBlockBytes = std::function<uint8_t*(bool swa, int block)>;

// What an export reads: one sequence's history and its block tables in the engine's pools.
struct KvSnapshotSource {
  const ModelConfig* config = nullptr;
  const KvPool* kv = nullptr;      // global layers
  const KvPool* swa_kv = nullptr;  // sliding layers; null without them
  const std::vector<int32_t>* tokens = nullptr;
  int n_past = 0;
  const std::vector<int>* blocks = nullptr;      // block table of kv
  const std::vector<int>* swa_blocks = nullptr;  // block table of swa_kv (-1: released)
  bool lazy_tail = false;
  KvBlockBytes block_bytes;  // empty: the pools' host storage
};

// Size of the snapshot write_kv_snapshot would build, without building it.
size_t kv_snapshot_bytes(const KvSnapshotSource& src);
// The snapshot of src (the format above).
std::string write_kv_snapshot(const KvSnapshotSource& src);

// A validated snapshot: fields of the header, the history, and a view of the rows.
// NOTE: rows points into the blob, which must outlive it.
struct KvSnapshot {
  KvFormat k_format = KvFormat::F16;
  KvFormat v_format = KvFormat::F16;
  int n_past = 0;
  int swa_from = 0;
  bool lazy_tail = false;
  std::vector<int32_t> tokens;
  const uint8_t* rows = nullptr;  // payload_bytes of K/V rows
  size_t payload_bytes = 0;
};

// Parses and validates a snapshot against the model `c`: magic, version, sizes
// (a truncated blob or trailing bytes), the checksum, then the geometry (arch,
// layers, KV heads, head_dim, width, vocabulary, sliding window and which layers
// slide) and the counts. Throws std::invalid_argument naming what is wrong;
// never reads outside [data, data + n).
KvSnapshot read_kv_snapshot(const uint8_t* data, size_t n, const ModelConfig& c);

// Writes the snapshot's rows into the destination pools through the sequence's
// block tables (which cover [0, n_past) and the sliding window), for positions
// >= skip_before of the global layers (rows already held through prefix
// sharing); converts rows when a pool's format differs from the snapshot's
// (kern.kv_load_row to f32, then kv_store_row into the pool's format).
void write_kv_snapshot_rows(const KvSnapshot& snap, const ModelConfig& c, KvPool& kv, KvPool* swa_kv,
                            const std::vector<int>& blocks, const std::vector<int>& swa_blocks, int skip_before,
                            const Kernels& kern, const KvBlockBytes& block_bytes = {});

}  // namespace kvs
