// AVX-512 (F, BW, VL) + VNNI kernels: integer dots with vpdpbusd on 256-bit
// lanes (one ggml block per register), 512-bit float loops. Compiled with
// -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mavx2 -mfma -mf16c for this file only.
#define KVS_DOT_U8S8(u, s) _mm256_dpbusd_epi32(_mm256_setzero_si256(), (u), (s))
#define KVS_KERNELS_FN kernels_avx512
#define KVS_LEVEL_NAME "avx512"
#define KVS_WIDE_FLOAT 1
#define KVS_VNNI 1
#include "x86_simd.inc"
