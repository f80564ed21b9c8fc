// The Vulkan entry points the backend uses, loaded at run time from libvulkan.so.1 (no link-time
// dependency: a machine without a Vulkan loader still loads the module and runs the CPU backend).
#pragma once

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

#include <string>

namespace kvs::vk {

// X(name) for every function, by the level it is loaded at.
#define KVS_VK_GLOBAL_FNS(X) \
  X(vkCreateInstance)        \
  X(vkEnumerateInstanceVersion)

#define KVS_VK_INSTANCE_FNS(X)                \
  X(vkDestroyInstance)                        \
  X(vkEnumeratePhysicalDevices)               \
  X(vkGetPhysicalDeviceProperties)            \
  X(vkGetPhysicalDeviceProperties2)           \
  X(vkGetPhysicalDeviceFeatures2)             \
  X(vkGetPhysicalDeviceMemoryProperties)      \
  X(vkGetPhysicalDeviceMemoryProperties2)     \
  X(vkGetPhysicalDeviceQueueFamilyProperties) \
  X(vkEnumerateDeviceExtensionProperties)     \
  X(vkCreateDevice)                           \
  X(vkGetDeviceProcAddr)

#define KVS_VK_DEVICE_FNS(X)       \
  X(vkDestroyDevice)               \
  X(vkGetDeviceQueue)              \
  X(vkCreateBuffer)                \
  X(vkDestroyBuffer)               \
  X(vkGetBufferMemoryRequirements) \
  X(vkAllocateMemory)              \
  X(vkFreeMemory)                  \
  X(vkBindBufferMemory)            \
  X(vkMapMemory)                   \
  X(vkUnmapMemory)                 \
  X(vkCreateShaderModule)          \
  X(vkDestroyShaderModule)         \
  X(vkCreateDescriptorSetLayout)   \
  X(vkDestroyDescriptorSetLayout)  \
  X(vkCreatePipelineLayout)        \
  X(vkDestroyPipelineLayout)       \
  X(vkCreateComputePipelines)      \
  X(vkDestroyPipeline)             \
  X(vkCreateDescriptorPool)        \
  X(vkDestroyDescriptorPool)       \
  X(vkResetDescriptorPool)         \
  X(vkAllocateDescriptorSets)      \
  X(vkUpdateDescriptorSets)        \
  X(vkCreateCommandPool)           \
  X(vkDestroyCommandPool)          \
  X(vkAllocateCommandBuffers)      \
  X(vkBeginCommandBuffer)          \
  X(vkEndCommandBuffer)            \
  X(vkResetCommandBuffer)          \
  X(vkCmdBindPipeline)             \
  X(vkCmdBindDescriptorSets)       \
  X(vkCmdPushConstants)            \
  X(vkCmdDispatch)                 \
  X(vkCmdCopyBuffer)               \
  X(vkCmdPipelineBarrier)          \
  X(vkQueueSubmit)                 \
  X(vkCreateFence)                 \
  X(vkDestroyFence)                \
  X(vkWaitForFences)               \
  X(vkResetFences)

#define KVS_VK_DECLARE(name) PFN_##name name = nullptr;

// One process-wide table. Global and instance entry points are filled by load_instance; device
// entry points live in a Device (vulkan_backend.cpp) filled by load_device.
struct Api {
  PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr = nullptr;
  KVS_VK_GLOBAL_FNS(KVS_VK_DECLARE)
  KVS_VK_INSTANCE_FNS(KVS_VK_DECLARE)
};

struct DeviceApi {
  KVS_VK_DEVICE_FNS(KVS_VK_DECLARE)
};

// The loader's global entry points; throws std::runtime_error naming what to install when
// libvulkan.so.1 cannot be opened (or $KVSWARM_VULKAN_LOADER, a path to another loader).
const Api& loader();
// Instance-level entry points of `instance` into api (a copy of loader()).
void load_instance(Api& api, VkInstance instance);
// Device-level entry points of `device`; throws naming the first one the driver lacks.
void load_device(const Api& api, VkDevice device, DeviceApi& out);

// "VK_ERROR_OUT_OF_DEVICE_MEMORY", ... ("VkResult N" for a code this table lacks).
const char* result_name(VkResult r);
// Throws std::runtime_error "<call> failed: <VkResult>" unless r is VK_SUCCESS.
void check(VkResult r, const char* call);

}  // namespace kvs::vk
