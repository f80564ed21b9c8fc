// DST (R, n) row r = SRC (T, n) row idx[r], or zeros where idx[r] lies outside [0, T): the rows routed to
// the experts, grouped by expert (device_forward.cpp's moe_ffn). One workgroup row per destination row.
#version 450

#define THREADS 256

layout(local_size_x = THREADS) in;
layout(std430, binding = 0) readonly buffer Sb { float src[]; };  // (T, n)
layout(std430, binding = 1) readonly buffer Ib { int idx[]; };    // (R,)
layout(std430, binding = 2) writeonly buffer Db { float dst[]; }; // (R, n)
layout(push_constant) uniform Params {
  uint T;
  uint n;
  uint R;
} p;

void main() {
  const uint i = gl_GlobalInvocationID.x;
  const uint r = gl_WorkGroupID.y + gl_WorkGroupID.z * gl_NumWorkGroups.y;  // rows over y, then z
  if (i >= p.n || r >= p.R) return;
  const int s = idx[r];
  dst[r * p.n + i] = s >= 0 && uint(s) < p.T ? src[uint(s) * p.n + i] : 0.0;
}
