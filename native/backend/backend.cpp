// Backend selection and the build-time facts the bindings report.
#include "backend.h"

#include <stdexcept>
#include <string>
#if defined(KVS_HAVE_VULKAN)
#include "vulkan/vulkan_backend.h"
#endif

namespace kvs {

namespace {
constexpr const char* kNoVulkanBuild =
    "this build of kvswarm has no Vulkan backend: glslc or the Vulkan headers were missing when it was built. "
    "To fix: apt-get install libvulkan-dev glslc mesa-vulkan-drivers (or run `make vulkan-tools` as root), "
    "then rebuild with `make build`";
}  // namespace

void check_attention_shape(const AttentionShape& s, const Buffer& pool, const char* op) {
  const std::string w = std::string(op) + ": ";
  if (s.T <= 0 || s.n_past < s.T) throw std::invalid_argument(w + "need n_past >= T >= 1");
  if (s.n_head <= 0 || s.n_head_kv <= 0 || s.n_head % s.n_head_kv != 0) {
    throw std::invalid_argument(w + "n_head must be a positive multiple of n_head_kv");
  }
  if (s.head_dim <= 0 || s.block_tokens <= 0) throw std::invalid_argument(w + "head_dim and block_tokens must be > 0");
  const size_t k_rows = kv_row_bytes(s.k_format, s.head_dim) * s.block_tokens * s.n_head_kv;
  const size_t v_rows = kv_row_bytes(s.v_format, s.head_dim) * s.block_tokens * s.n_head_kv;
  if (s.k_offset + k_rows > s.block_bytes || s.v_offset + v_rows > s.block_bytes) {
    throw std::invalid_argument(w + "K or V rows run past block_bytes " + std::to_string(s.block_bytes));
  }
  if (pool.bytes() < s.block_bytes) throw std::invalid_argument(w + "the pool holds less than one block");
}

void check_block_table(const int32_t* blocks, int nb, const AttentionShape& s, const Buffer& pool, const char* op) {
  const size_t n_blocks = pool.bytes() / s.block_bytes;
  for (int b = 0; b < nb; ++b) {
    if (blocks[b] < 0 || static_cast<size_t>(blocks[b]) >= n_blocks) {
      throw std::invalid_argument(std::string(op) + ": block table entry " + std::to_string(b) + " = " +
                                  std::to_string(blocks[b]) + " lies outside the pool of " + std::to_string(n_blocks) +
                                  " blocks");
    }
  }
}

void check_view(const Buffer& b, size_t offset, size_t bytes, const char* op, const char* what) {
  if (offset % kBufferViewAlign != 0) {
    throw std::invalid_argument(std::string(op) + ": " + what + " offset " + std::to_string(offset) +
                                " is not a multiple of " + std::to_string(kBufferViewAlign) +
                                " bytes (kBufferViewAlign); pad the layout so each view starts aligned");
  }
  if (offset > b.bytes() || bytes > b.bytes() - offset) {
    throw std::invalid_argument(std::string(op) + ": " + what + " view [" + std::to_string(offset) + ", " +
                                std::to_string(offset + bytes) + ") lies outside its buffer of " +
                                std::to_string(b.bytes()) + " bytes");
  }
}

bool backend_has_vulkan() {
#if defined(KVS_HAVE_VULKAN)
  return true;
#else
  return false;
#endif
}

std::vector<VulkanDeviceInfo> vulkan_devices() {
#if defined(KVS_HAVE_VULKAN)
  return vulkan_devices_impl();
#else
  throw std::runtime_error(kNoVulkanBuild);
#endif
}

std::unique_ptr<Backend> make_backend(const std::string& name, int device, bool float_activations) {
  if (name == "cpu") {
    if (device != 0)
      throw std::invalid_argument("backend cpu has one device (0), got device " + std::to_string(device));
    return make_cpu_backend(float_activations);
  }
  if (name == "vulkan") {
#if defined(KVS_HAVE_VULKAN)
    return make_vulkan_backend(device, float_activations);
#else
    throw std::runtime_error(kNoVulkanBuild);
#endif
  }
  throw std::invalid_argument("unknown backend '" + name + "' (expected cpu or vulkan)");
}

}  // namespace kvs
