// Picks the kernel table once from cpuid; $KVSWARM_ISA forces a level.
#include <cstdlib>
#include <stdexcept>

#if defined(KVS_HAVE_NEON) && defined(__linux__)
#include <sys/auxv.h>
#endif
#if defined(KVS_HAVE_X86) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "kernels.h"

namespace kvs {

static bool cpu_has_avx2() {
#if defined(KVS_HAVE_X86) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

static bool cpu_has_avx512_vnni() {
#if defined(KVS_HAVE_X86) && (defined(__GNUC__) || defined(__clang__))
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

// AMX-TILE and AMX-INT8 in cpuid, the tile state enabled in XCR0, and Linux's permission for this
// process to use the tile data (arch_prctl ARCH_REQ_XCOMP_PERM, asked once; a kernel before 5.16
// refuses it, and the level is then absent).
static bool cpu_has_amx() {
#if defined(KVS_HAVE_X86) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
  static const bool ok = [] {
    if (!cpu_has_avx512_vnni()) return false;
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
    constexpr unsigned kAmxTile = 1u << 24, kAmxInt8 = 1u << 25;
    if ((d & kAmxTile) == 0 || (d & kAmxInt8) == 0) return false;
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    constexpr unsigned kTileState = (1u << 17) | (1u << 18);  // XTILECFG, XTILEDATA
    if ((lo & kTileState) != kTileState) return false;
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
#else
  return false;
#endif
}

[[maybe_unused]] static bool cpu_has_dotprod() {
#if defined(KVS_HAVE_NEON) && defined(__linux__)
  constexpr unsigned long kHwcapAsimdDp = 1ul << 20;  // HWCAP_ASIMDDP in <asm/hwcap.h>
  return (getauxval(AT_HWCAP) & kHwcapAsimdDp) != 0;
#else
  return false;
#endif
}

std::vector<std::string> available_isa_levels() {
  std::vector<std::string> levels{"ref"};
  if (cpu_has_avx2()) levels.emplace_back("avx2");
  if (cpu_has_avx512_vnni()) levels.emplace_back("avx512");
  if (cpu_has_amx()) levels.emplace_back("avx512_amx");
#if defined(KVS_HAVE_NEON)
  levels.emplace_back("neon");
  if (cpu_has_dotprod()) levels.emplace_back("neon_dotprod");
#endif
  return levels;
}

const Kernels& kernels_for(const std::string& level) {
  if (level == "ref") return kernels_ref();
#if defined(KVS_HAVE_X86)
  if (level == "avx2" && cpu_has_avx2()) return kernels_avx2();
  if (level == "avx512" && cpu_has_avx512_vnni()) return kernels_avx512();
  if (level == "avx512_amx" && cpu_has_amx()) return kernels_avx512_amx();
#endif
#if defined(KVS_HAVE_NEON)
  if (level == "neon") return kernels_neon();
  if (level == "neon_dotprod" && cpu_has_dotprod()) return kernels_neon_dotprod();
#endif
  std::string have;
  for (const auto& l : available_isa_levels()) have += (have.empty() ? "" : ", ") + l;
  throw std::invalid_argument("ISA level '" + level + "' is not available on this machine (available: " + have +
                              "); unset KVSWARM_ISA or pick one of those");
}

const Kernels& active_kernels() {
  static const Kernels& k = []() -> const Kernels& {
    const char* forced = std::getenv("KVSWARM_ISA");
    if (forced != nullptr && *forced != '\0') return kernels_for(forced);
    return kernels_for(available_isa_levels().back());
  }();
  return k;
}

}  // namespace kvs
