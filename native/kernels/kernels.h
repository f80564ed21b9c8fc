// Hot loops behind one table of function pointers, filled once per ISA level.
// kernels/ref.cpp is the scalar reference every other level is tested against;
// each ISA lives in its own file compiled with its own flags.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../kv_format.h"
#include "../quant.h"

namespace kvs {

struct Kernels {
  const char* name;  // "ref", "avx2", ...
  // a (n,) . b (n,) -> scalar
  float (*dot_f32)(const float* a, const float* b, int n);
  // y (n,) += alpha * x (n,)
  void (*axpy_f32)(float alpha, const float* x, float* y, int n);
  // One weight row of n elements (n a multiple of the type's block) -> dst (n,) floats.
  void (*dequant_row)(GgmlType type, const void* src, float* dst, int64_t n);
  // One KV row (head_dim elements in format f) -> dst (head_dim,) floats.
  void (*kv_load_row)(KvFormat f, const void* src, float* dst, int head_dim);
};

// Scalar reference table; always available.
const Kernels& kernels_ref();
#if defined(KVS_HAVE_X86)
const Kernels& kernels_avx2();
#endif

// Levels this machine can run, best last (e.g. {"ref", "avx2"}).
std::vector<std::string> available_isa_levels();
// The table for a level; throws std::invalid_argument for a level this machine lacks.
const Kernels& kernels_for(const std::string& level);
// The active table: best available level, or the one named by $KVSWARM_ISA.
const Kernels& active_kernels();

}  // namespace kvs
