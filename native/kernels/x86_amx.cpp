// AVX-512 VNNI kernels plus AMX tiles (AMX-TILE, AMX-INT8) for the weight tiles' many-row calls
// (batched decode, prefill); everything else is the avx512 level's. Compiled with the avx512 flags
// plus -mamx-tile -mamx-int8 for this file only.
#define KVS_DOT_U8S8(u, s) _mm256_dpbusd_epi32(_mm256_setzero_si256(), (u), (s))
#define KVS_KERNELS_FN kernels_avx512_amx
#define KVS_LEVEL_NAME "avx512_amx"
#define KVS_WIDE_FLOAT 1
#define KVS_VNNI 1
#define KVS_AMX 1
#include "x86_simd.inc"
