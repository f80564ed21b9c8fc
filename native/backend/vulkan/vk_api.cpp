#include "vk_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>

namespace kvs::vk {

namespace {

constexpr const char* kInstallHint =
    "install a Vulkan loader and driver (Debian/Ubuntu: apt-get install libvulkan1 mesa-vulkan-drivers; "
    "mesa-vulkan-drivers brings lavapipe, a CPU Vulkan)";

Api load_loader() {
  const char* env = std::getenv("KVSWARM_VULKAN_LOADER");
  const std::string path = env != nullptr && *env != '\0' ? env : "libvulkan.so.1";
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);  // NOTE: never closed (drivers keep threads)
  if (lib == nullptr) {
    const char* why = dlerror();
    throw std::runtime_error("cannot open the Vulkan loader " + path + " (" + (why ? why : "dlopen failed") +
                             "): " + kInstallHint);
  }
  Api api;
  api.vkGetInstanceProcAddr = reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(lib, "vkGetInstanceProcAddr"));
  if (api.vkGetInstanceProcAddr == nullptr) {
    throw std::runtime_error(path + " has no vkGetInstanceProcAddr: not a Vulkan loader; " + kInstallHint);
  }
#define KVS_VK_LOAD_GLOBAL(name) api.name = reinterpret_cast<PFN_##name>(api.vkGetInstanceProcAddr(nullptr, #name));
  KVS_VK_GLOBAL_FNS(KVS_VK_LOAD_GLOBAL)
#undef KVS_VK_LOAD_GLOBAL
  if (api.vkCreateInstance == nullptr) throw std::runtime_error(path + " does not export vkCreateInstance");
  return api;
}

}  // namespace

const Api& loader() {
  static std::once_flag once;
  static Api api;
  static std::string error;
  std::call_once(once, [] {
    try {
      api = load_loader();
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  if (!error.empty()) throw std::runtime_error(error);
  return api;
}

void load_instance(Api& api, VkInstance instance) {
#define KVS_VK_LOAD_INSTANCE(name)                                                                  \
  api.name = reinterpret_cast<PFN_##name>(api.vkGetInstanceProcAddr(instance, #name));              \
  if (api.name == nullptr) {                                                                        \
    throw std::runtime_error(std::string("the Vulkan loader lacks ") + #name +                      \
                             " (Vulkan 1.1 or newer is needed: update libvulkan1 and the driver)"); \
  }
  KVS_VK_INSTANCE_FNS(KVS_VK_LOAD_INSTANCE)
#undef KVS_VK_LOAD_INSTANCE
}

void load_device(const Api& api, VkDevice device, DeviceApi& out) {
#define KVS_VK_LOAD_DEVICE(name)                                                   \
  out.name = reinterpret_cast<PFN_##name>(api.vkGetDeviceProcAddr(device, #name)); \
  if (out.name == nullptr) throw std::runtime_error(std::string("the Vulkan driver lacks ") + #name);
  KVS_VK_DEVICE_FNS(KVS_VK_LOAD_DEVICE)
#undef KVS_VK_LOAD_DEVICE
}

const char* result_name(VkResult r) {
  switch (r) {
#define KVS_VK_CASE(x) \
  case x:              \
    return #x;
    KVS_VK_CASE(VK_SUCCESS)
    KVS_VK_CASE(VK_NOT_READY)
    KVS_VK_CASE(VK_TIMEOUT)
    KVS_VK_CASE(VK_INCOMPLETE)
    KVS_VK_CASE(VK_ERROR_OUT_OF_HOST_MEMORY)
    KVS_VK_CASE(VK_ERROR_OUT_OF_DEVICE_MEMORY)
    KVS_VK_CASE(VK_ERROR_INITIALIZATION_FAILED)
    KVS_VK_CASE(VK_ERROR_DEVICE_LOST)
    KVS_VK_CASE(VK_ERROR_MEMORY_MAP_FAILED)
    KVS_VK_CASE(VK_ERROR_LAYER_NOT_PRESENT)
    KVS_VK_CASE(VK_ERROR_EXTENSION_NOT_PRESENT)
    KVS_VK_CASE(VK_ERROR_FEATURE_NOT_PRESENT)
    KVS_VK_CASE(VK_ERROR_INCOMPATIBLE_DRIVER)
    KVS_VK_CASE(VK_ERROR_TOO_MANY_OBJECTS)
    KVS_VK_CASE(VK_ERROR_FORMAT_NOT_SUPPORTED)
    KVS_VK_CASE(VK_ERROR_FRAGMENTED_POOL)
    KVS_VK_CASE(VK_ERROR_UNKNOWN)
    KVS_VK_CASE(VK_ERROR_OUT_OF_POOL_MEMORY)
    KVS_VK_CASE(VK_ERROR_INVALID_EXTERNAL_HANDLE)
    KVS_VK_CASE(VK_ERROR_FRAGMENTATION)
#undef KVS_VK_CASE
    default:
      return "VkResult (unnamed code)";
  }
}

void check(VkResult r, const char* call) {
  if (r != VK_SUCCESS) {
    throw std::runtime_error(std::string(call) + " failed: " + result_name(r) + " (VkResult " +
                             std::to_string(static_cast<int>(r)) + ")");
  }
}

}  // namespace kvs::vk
