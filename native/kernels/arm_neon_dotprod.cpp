// ARMv8.2 NEON with the dot-product extension (sdot), e.g. Cortex-A76 / RK3588.
// Compiled with -march=armv8.2-a+dotprod for this file only.
#define KVS_SDOT16(acc, a, b) vdotq_s32((acc), (a), (b))
#define KVS_KERNELS_FN kernels_neon_dotprod
#define KVS_LEVEL_NAME "neon_dotprod"
#include "arm_neon.inc"
