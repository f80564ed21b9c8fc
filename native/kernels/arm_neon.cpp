// ARMv8 NEON kernels (every aarch64 core). Integer dots: widening multiplies
// (vmull_s8) and pairwise accumulation.
#define KVS_SDOT16(acc, a, b) \
  vpadalq_s16(vpadalq_s16((acc), vmull_s8(vget_low_s8(a), vget_low_s8(b))), vmull_s8(vget_high_s8(a), vget_high_s8(b)))
#define KVS_KERNELS_FN kernels_neon
#define KVS_LEVEL_NAME "neon"
#include "arm_neon.inc"
