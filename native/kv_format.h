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

}  // namespace kvs
