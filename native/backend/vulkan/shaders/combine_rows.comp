// DST (T, n) row t = sum over k = 0 .. K-1, in that order, of weight[t, k] * SRC (R, n) row idx[t, k]:
// each token's routed expert outputs mixed by its router weights (device_forward.cpp's moe_ffn). The sum
// starts at zero and adds the choices best first, as model.cpp's moe_ffn does; `precise` keeps each
// product and sum rounded apart (no fused multiply-add), as the CPU's. An idx outside [0, R) adds nothing.
#version 450

#define THREADS 256

layout(local_size_x = THREADS) in;
layout(std430, binding = 0) readonly buffer Sb { float src[]; };    // (R, n)
layout(std430, binding = 1) readonly buffer Ib { int idx[]; };      // (T, K)
layout(std430, binding = 2) readonly buffer Wb { float weight[]; }; // (T, K)
layout(std430, binding = 3) writeonly buffer Db { float dst[]; };   // (T, n)
layout(push_constant) uniform Params {
  uint R;
  uint n;
  uint T;
  uint K;
} p;

void main() {
  const uint i = gl_GlobalInvocationID.x;
  const uint t = gl_WorkGroupID.y + gl_WorkGroupID.z * gl_NumWorkGroups.y;  // rows over y, then z
  if (i >= p.n || t >= p.T) return;
  precise float acc = 0.0;
  for (uint k = 0u; k < p.K; ++k) {
    const int r = idx[t * p.K + k];
    if (r < 0 || uint(r) >= p.R) continue;
    precise float term = weight[t * p.K + k] * src[uint(r) * p.n + i];
    acc += term;
  }
  dst[t * p.n + i] = acc;
}
