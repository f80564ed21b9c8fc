// X (T, cols) f32 -> QA (T, cols / 32) blocks of 8-bit activations for the integer-dot matmul
// (matmul_dot.comp), kernels/ref.cpp's quantize_act bit for bit: per 32 elements d = amax / 127,
// q = round-to-nearest-even(x * (1 / d)), ds = d * sum(q) (the Q4_0 offset and the Q4_1 minimum need it).
// A block is kernels.h's BlockQ8A {float d; float ds; int8 qs[32]}: 10 words, element 4k + j in byte j of
// word 2 + k. One invocation per block; cols is a multiple of 32 (every integer-dot weight format's block).
#version 450

#define THREADS 64
#define QK 32
#define BLOCK_WORDS 10  // sizeof(BlockQ8A) / 4

layout(local_size_x = THREADS) in;
layout(std430, binding = 0) readonly buffer Xb { float x[]; };  // (T, cols)
layout(std430, binding = 1) writeonly buffer Qb { uint qa[]; };  // (T * cols / 32) BlockQ8A
layout(push_constant) uniform Params {
  uint n_blocks;  // T * cols / 32
} p;

// a / b rounded to nearest, as the CPU divides (Vulkan lets a plain `/` err by 2.5 ulp, and a scale one
// ulp off moves quants across a rounding boundary): one correction step on the residual (kv_store.comp's).
float div_rn(float a, float b) {
  precise float q = a / b;
  precise float r = fma(-q, b, a);
  precise float c = fma(r, 1.0 / b, q);
  return c;
}

void main() {
  const uint b = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * THREADS;
  if (b >= p.n_blocks) return;
  const uint x0 = b * QK;
  float amax = 0.0;
  for (uint i = 0; i < QK; ++i) amax = max(amax, abs(x[x0 + i]));
  const float d = div_rn(amax, 127.0);
  const float id = d != 0.0 ? div_rn(1.0, d) : 0.0;
  int sum = 0;
  const uint o = b * BLOCK_WORDS;
  for (uint k = 0; k < QK / 4; ++k) {
    uint word = 0u;
    for (uint j = 0; j < 4; ++j) {
      precise float v = x[x0 + 4u * k + j] * id;  // no fused multiply-add: the CPU rounds the product
      const int q = int(roundEven(v));
      sum += q;
      word |= (uint(q) & 0xFFu) << (8u * j);
    }
    qa[o + 2u + k] = word;
  }
  qa[o] = floatBitsToUint(d);
  precise float ds = d * float(sum);
  qa[o + 1u] = floatBitsToUint(ds);
}
