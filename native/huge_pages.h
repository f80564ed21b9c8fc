// Anonymous memory at a 2 MiB boundary, advised for transparent huge pages: the KV slabs and the read
// bandwidth probe (whose limit the weights, also in huge pages, are measured against).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace kvs {

constexpr size_t kHugePageBytes = size_t{2} << 20;

// size bytes of zeroed memory at a kHugePageBytes boundary, advised MADV_HUGEPAGE (where the kernel has
// transparent huge pages; elsewhere plain pages). Pages are committed as they are touched. Throws
// std::bad_alloc when the map fails. advised (if given): whether the kernel took the advice.
std::shared_ptr<uint8_t> map_huge_pages(size_t size, bool* advised = nullptr);

}  // namespace kvs
