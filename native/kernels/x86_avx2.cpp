// AVX2 + FMA + F16C kernels (compiled with -mavx2 -mfma -mf16c for this file
// only). Integer dots: maddubs (u8 x s8 -> s16 pairs) then madd with ones.
#define KVS_DOT_U8S8(u, s) _mm256_madd_epi16(_mm256_maddubs_epi16((u), (s)), _mm256_set1_epi16(1))
#define KVS_KERNELS_FN kernels_avx2
#define KVS_LEVEL_NAME "avx2"
#define KVS_WIDE_FLOAT 0
#define KVS_VNNI 0
#include "x86_simd.inc"
