#include "huge_pages.h"

#include <sys/mman.h>

#include <new>

namespace kvs {

std::shared_ptr<uint8_t> map_huge_pages(size_t size, bool* advised) {
  const size_t span = size + kHugePageBytes;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  auto* base = static_cast<uint8_t*>(raw);
  auto* p =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(base) + kHugePageBytes - 1) & ~(kHugePageBytes - 1));
  if (p > base) munmap(base, static_cast<size_t>(p - base));
  if (p + size < base + span) munmap(p + size, static_cast<size_t>(base + span - (p + size)));
  bool taken = false;
#ifdef MADV_HUGEPAGE
  taken = madvise(p, size, MADV_HUGEPAGE) == 0;  // advice only: without it the memory still works
#endif
  if (advised != nullptr) *advised = taken;
  return std::shared_ptr<uint8_t>(p, [size](uint8_t* q) { munmap(q, size); });
}

}  // namespace kvs
