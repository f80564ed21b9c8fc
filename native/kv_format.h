// KV-cache storage formats. One "row" is the vector of one (token, kv head):
// head_dim elements. K and V may use different formats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvs {

enum class KvFormat : int {
  F32 = 0,      // plain float
  F16 = 1,      // IEEE half
  Q8_0 = 2,     // ggml BlockQ8_0 (f16 scale + 32 int8) per 32 elements
  Q8_HEAD = 3,  // int8 per element + one f32 scale per row: [float scale][int8 q[head_dim]]
  Q4_0 = 4,     // ggml BlockQ4_0 (f16 scale + 16 bytes of nibbles) per 32 elements
};

// Parses "f32", "f16", "q8_0", "q8_head", "q4_0"; throws std::invalid_argument otherwise.
KvFormat kv_format_from_string(const std::string& name);
const char* kv_format_name(KvFormat f);

// Bytes of one row of head_dim elements. Throws when head_dim does not fit the
// format's block size (q8_0 and q4_0 need a multiple of 32).
size_t kv_row_bytes(KvFormat f, int head_dim);

// Encode one row (scalar code for every ISA so stored bytes never depend on the machine).
void kv_store_row(KvFormat f, const float* src, void* dst, int head_dim);

// Key tiles: a CPU pool whose kernels score keys 16 rows at a time (Kernels::key_tiles) stores the
// q8_0 and q4_0 K rows of each 16 consecutive slots of one (layer, kv head) run as one tile, the same
// bytes as the 16 rows permuted so that each 64-byte line holds one 4-byte group of all 16 rows (one
// vector register, lane r = row r): the scores then need no transpose and no scale gather.
// With nb = head_dim / 32 blocks a row, a tile of 16 * kv_row_bytes bytes is
//   [block b][row r]: the f16 scale d of row r's block b, 2 bytes at 2 * (16 b + r)  (32 nb bytes)
//   then [block b][group k][row r]: bytes qs[4k .. 4k + 3] of row r's block b, 4 bytes at
//   32 nb + 64 (G b + k) + 4 r, G = 8 groups (q8_0, int8) or 4 (q4_0, packed nibbles as stored).
// Value tiles (Kernels::value_tiles) hold the V rows of 16 slots for sums four rows at a time: the
// scales as in a key tile, then [block b][row quad i][byte j][row r % 4]: byte qs[j] of row r's
// block b (i = r / 4) at 32 nb + 4 Q (4 b + i) + 4 j + r % 4, with Q = 32 bytes a block (q8_0) or 16
// (q4_0: byte j holds dims j and j + 16 as stored). So 4 Q bytes hold a quad's block: lane x (4 bytes)
// of a q8_0 quad's first (second) 64-byte line is dim x (16 + x) of its 4 rows; a q4_0 quad's one
// line holds dims 0-15 in its low nibbles and 16-31 in its high ones, in the same order.
// Snapshots, device pools and every other reader see rows (kv_tile_get_row / kv_tile_put_row). A key
// tile is the weight tile of the same block format (quant.h), which both share.
constexpr int kKeyTileRows = 16;
enum class KvTile { Keys, Values };
// Formats that have a tile layout: q8_0 and q4_0.
bool kv_format_tiles(KvFormat f);
// Row r (0..15) of a tile of the given kind <-> one row in kv_row_bytes(f, head_dim) layout.
void kv_tile_put_row(KvFormat f, KvTile kind, const void* row, uint8_t* tile, int r, int head_dim);
void kv_tile_get_row(KvFormat f, KvTile kind, const uint8_t* tile, int r, void* row, int head_dim);

}  // namespace kvs
