// The backend layer: the ops the model's forward calls, on one device.
//
// `cpu` runs today's kernels (kernels/), `vulkan` runs GLSL compute shaders through a
// Vulkan loader opened at run time. Only native/backend/vulkan/ knows Vulkan.
// NOTE: model.cpp's forward (EngineOptions.backend "cpu") still calls the CPU kernels directly, unchanged;
// device_forward.cpp runs the same model over these ops (backend "vulkan", or "cpu-ops": this interface on
// the CPU backend, the reference), with the paged KV pool in one device Buffer (docs/GPU.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../kv_format.h"
#include "../quant.h"

namespace kvs {

// Memory owned by one backend: host memory for `cpu`, a device-local buffer for `vulkan`.
// Contents move only through Backend::upload / Backend::download.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual size_t bytes() const = 0;
};

enum class RopePairs : int {
  kAdjacent = 0,   // pairs (x[2i], x[2i+1]) of each head (llama.cpp "normal")
  kHalfSplit = 1,  // pairs (x[i], x[i + n_rot/2]) of each head (llama.cpp "NEOX")
};

enum class GateAct : int {
  kSilu = 0,      // SwiGLU: silu(g) * u
  kGeluTanh = 1,  // GeGLU: gelu_tanh(g) * u
};

// Flash-decode attention of T query rows over one sequence's paged KV, in the CPU pool's layout
// (kv_cache.h): one pool buffer of blocks of block_bytes; the row of (kv head h, slot j) of this
// layer's K in table block b starts at byte
//   blocks[b] * block_bytes + k_offset + (h * block_tokens + j) * kv_row_bytes(k_format, head_dim)
// and V alike at v_offset.
struct AttentionShape {
  int T = 1;              // query rows (decode: 1 per sequence)
  int n_head = 0;         // query heads
  int n_head_kv = 0;      // kv heads (GQA: n_head % n_head_kv == 0)
  int head_dim = 0;       // elements per head
  int block_tokens = 16;  // positions per KV block
  int n_past = 0;         // positions of the sequence in the KV, the T query rows' included
  float scale = 1.0f;     // score scale, usually 1/sqrt(head_dim)
  size_t block_bytes = 0;
  size_t k_offset = 0;
  size_t v_offset = 0;
  KvFormat k_format = KvFormat::F16;
  KvFormat v_format = KvFormat::F16;
  int window = 0;  // attention_rows: > 0, a row at position p sees (p - window, p] only (sliding layer)
};

// The rows of a batch for attention_rows and kv_store: rows (T, 2) int32, row t = {position p_t, first
// entry of its sequence's block table in `tables`}; position p lives in pool block
// tables[first + p / block_tokens], slot p % block_tokens. Several rows may share one table (a prefill
// chunk); each row sees its own causal range.
struct RowTable {
  int T = 0;
  int block_tokens = 16;
  size_t block_bytes = 0;  // bytes of one pool block
};

// NOTE: a backend may queue ops and run them later (Vulkan records them into one command buffer):
// download() and sync() wait for every op before them, and a Buffer must outlive the ops that use it
// (sync() before destroying one that a queued op reads or writes).
class Backend {
 public:
  virtual ~Backend() = default;
  // "cpu" or "vulkan:<device name>".
  virtual std::string name() const = 0;
  // How matmul multiplies quantized weights (and attention scores 8-bit keys): "integer dot" (activations and
  // queries quantized to 8-bit blocks, as the CPU engine does) or "float" (decoded and dotted in float32).
  virtual const char* dot_path() const { return "float"; }

  virtual std::unique_ptr<Buffer> alloc(size_t bytes) = 0;
  // Copies src (bytes,) into buf at offset; throws when it does not fit.
  virtual void upload(Buffer& buf, const void* src, size_t bytes, size_t offset = 0) = 0;
  // Copies buf [offset, offset + bytes) into dst; waits for every op before it.
  virtual void download(const Buffer& buf, void* dst, size_t bytes, size_t offset = 0) = 0;

  // W (rows, cols) stored as `type` @ X (T, cols) f32 -> Y (T, rows) f32; each weight row is read
  // once for many of the T rows (a decode step over T sequences reads the weights once).
  virtual void matmul(GgmlType type, const Buffer& w, int64_t rows, int64_t cols, const Buffer& x, int T,
                      Buffer& y) = 0;
  // X (T, n) -> Y (T, n) = x / sqrt(mean(x^2) + eps) * w; w (n,).
  virtual void rms_norm(const Buffer& x, const Buffer& w, int T, int n, float eps, Buffer& y) = 0;
  // In place: X (T, n_head, head_dim); pos (T,) int32. Pair i of the first n_rot dims turns by
  // pos * base^(-2i/n_rot).
  virtual void rope(Buffer& x, const Buffer& pos, int T, int n_head, int head_dim, int n_rot, float base,
                    RopePairs style) = 0;
  // G (n,), U (n,) -> OUT (n,) = act(g) * u.
  virtual void gated(GateAct act, const Buffer& g, const Buffer& u, int64_t n, Buffer& out) = 0;
  // Q (T, n_head, head_dim) f32 against the paged K, V of one sequence -> OUT (T, n_head, head_dim).
  // blocks (ceil(n_past / block_tokens),) int32: the sequence's block table into pool. Row t
  // (position n_past - T + t) sees positions 0 .. n_past - T + t (causal).
  virtual void attention(const AttentionShape& s, const Buffer& q, const Buffer& pool, const Buffer& blocks,
                         Buffer& out) = 0;
  // Waits until every op issued so far has finished.
  virtual void sync() = 0;

  // --- ops of the model's forward over a batch of many sequences (device_forward.cpp) ---

  // True when matmul has a kernel for weights stored as `type`.
  virtual bool has_matmul(GgmlType type) const = 0;
  // dst [dst_offset, +bytes) = src [src_offset, +bytes); src and dst are different buffers.
  virtual void copy(const Buffer& src, size_t src_offset, Buffer& dst, size_t dst_offset, size_t bytes) = 0;
  // In place: Y (n,) += B[i % period] (period == n: a residual add; period = row width: a bias per row).
  virtual void add(Buffer& y, const Buffer& b, int64_t n, int64_t period) = 0;
  // In place: X (T, n_head, head_dim) turned by RoPE from a host-made table CS (T, n_rot/2, 2) of
  // (cos, sin) per row and pair; pairs as `style`, dims past n_rot untouched.
  virtual void rope_table(Buffer& x, const Buffer& cs, int T, int n_head, int head_dim, int n_rot, RopePairs style) = 0;
  // Stores SRC (T, n_kv_head, head_dim) f32 into the pool as `format` rows (kv_store_row's encoding):
  // the row of (row t, kv head h) at byte block * block_bytes + part_offset + (h * block_tokens + slot) *
  // kv_row_bytes(format, head_dim), block and slot from row t's position (RowTable).
  virtual void kv_store(KvFormat format, const Buffer& src, int n_kv_head, int head_dim, size_t part_offset,
                        const RowTable& rt, Buffer& pool, const Buffer& tables, const Buffer& rows) = 0;
  // Flash-decode attention of T query rows of many sequences: Q (T, n_head, head_dim) -> OUT (T, n_head,
  // head_dim); row t sees positions [lo, p_t] of its own table (lo = 0, or p_t + 1 - window clipped at 0).
  // s.T, s.block_tokens and s.block_bytes are the batch's; s.n_past is not used. Table entries that a row
  // reads must lie in the pool (the caller checks them: the tables are built on the host).
  virtual void attention_rows(const AttentionShape& s, const Buffer& q, const Buffer& pool, const Buffer& tables,
                              const Buffer& rows, Buffer& out) = 0;

  // --- ops of the routed experts (qwen3moe; device_forward.cpp's moe_ffn) ---

  // matmul over views: W (rows, cols) stored as `type` from byte w_offset of w @ X (T, cols) f32 from byte
  // x_offset of x -> Y (T, rows) f32 from byte y_offset of y; bytes outside the views are untouched. One
  // expert's slice of a stacked expert tensor against the rows routed to it, with no copy. Every offset is
  // a multiple of kBufferViewAlign (the largest storage-buffer offset alignment a Vulkan device may ask).
  virtual void matmul_view(GgmlType type, const Buffer& w, size_t w_offset, int64_t rows, int64_t cols, const Buffer& x,
                           size_t x_offset, int T, Buffer& y, size_t y_offset) = 0;
  // DST (R, n) row r = SRC (T, n) row idx[r], or zeros where idx[r] is outside [0, T); idx (R,) int32.
  virtual void gather_rows(const Buffer& src, int T, int n, const Buffer& idx, int R, Buffer& dst) = 0;
  // DST (T, n) row t = sum over k = 0 .. K-1, in that order, of weight[t, k] * SRC (R, n) row idx[t, k],
  // accumulated in float32 from zero (an idx outside [0, R) adds nothing); idx (T, K) int32, weight (T, K) f32.
  virtual void combine_rows(const Buffer& src, int R, int n, const Buffer& idx, const Buffer& weight, int T, int K,
                            Buffer& dst) = 0;
};

// The CPU backend over the active kernel table (kernels/): host buffers, ops run at once.
// float_activations: quantized weights are decoded and dotted in float32 (as the Vulkan shaders do)
// instead of against 8-bit activation blocks (Workspace::float_activations).
std::unique_ptr<Backend> make_cpu_backend(bool float_activations = false);
// "cpu" or "vulkan" (device index among vulkan_devices()). Throws std::invalid_argument for an
// unknown name and std::runtime_error naming what to install when Vulkan was not built or is absent.
// float_activations: quantized weights are dotted in float32 (no 8-bit activations) on either backend;
// otherwise Vulkan takes the integer-dot path where the device has it (Backend::dot_path, docs/GPU.md).
std::unique_ptr<Backend> make_backend(const std::string& name, int device = 0, bool float_activations = false);

// Throws std::invalid_argument naming the first field of s that no backend can serve, or that puts a
// layer's K or V rows past block_bytes or the pool past its size.
void check_attention_shape(const AttentionShape& s, const Buffer& pool, const char* op);
// Throws std::invalid_argument naming the first table entry (of nb) that lies outside the pool.
void check_block_table(const int32_t* blocks, int nb, const AttentionShape& s, const Buffer& pool, const char* op);

// Byte alignment of every offset given to Backend::matmul_view: 256, the largest
// minStorageBufferOffsetAlignment the Vulkan spec allows (a power of two), so one layout serves every device.
constexpr size_t kBufferViewAlign = 256;
// Throws std::invalid_argument when [offset, offset + bytes) is not inside b or offset is not a multiple
// of kBufferViewAlign; `what` names the operand in the message.
void check_view(const Buffer& b, size_t offset, size_t bytes, const char* op, const char* what);

// True when this module was built with the Vulkan backend (glslc and Vulkan headers found).
bool backend_has_vulkan();

// What Vulkan reports about one physical device.
struct VulkanDeviceInfo {
  int index = 0;
  std::string name;
  std::string type;  // "discrete", "integrated", "virtual", "cpu", "other"
  uint32_t vendor_id = 0;
  uint32_t device_id = 0;
  std::string vendor;  // "NVIDIA", "AMD", "Intel", "ARM", "Mesa", ... from vendor_id
  std::string driver_name;
  std::string driver_info;
  std::string api_version;  // "1.3.230"
  std::string driver_version;
  uint64_t device_local_bytes = 0;   // largest device-local heap
  uint64_t device_local_budget = 0;  // VK_EXT_memory_budget for that heap (0 when the extension is absent)
  bool memory_budget_ext = false;
  uint32_t subgroup_size = 0;
  bool subgroup_arithmetic = false;  // subgroupAdd & co. in compute shaders (the matmul's subgroup variant)
  bool shader_int8 = false;
  bool shader_float16 = false;
  bool integer_dot_product = false;          // VK_KHR_shader_integer_dot_product (or Vulkan 1.3) feature
  bool integer_dot_4x8_accelerated = false;  // packed 4x8-bit signed dot is hardware accelerated
  uint32_t max_workgroup_size = 0;
  uint64_t max_storage_buffer_range = 0;
};

// Every physical device the Vulkan loader reports. Throws std::runtime_error naming what to install
// when the build has no Vulkan backend or libvulkan.so.1 cannot be opened.
std::vector<VulkanDeviceInfo> vulkan_devices();

}  // namespace kvs
