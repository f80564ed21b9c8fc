// The Vulkan backend (built only with KVS_HAVE_VULKAN): see backend.h for the op contracts.
#pragma once

#include <memory>
#include <vector>

#include "../backend.h"

namespace kvs {

// Device `index` among vulkan_devices(); throws std::invalid_argument for an index out of range.
// float_activations: the float path even where the device has integer dot products (Backend::dot_path).
std::unique_ptr<Backend> make_vulkan_backend(int index, bool float_activations = false);
std::vector<VulkanDeviceInfo> vulkan_devices_impl();

}  // namespace kvs
