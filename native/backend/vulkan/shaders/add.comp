// In place: Y (n,) += B[i % period]. period == n: a residual add; period = row width: a bias on every row.
#version 450

#define THREADS 256

layout(local_size_x = THREADS) in;
layout(std430, binding = 0) buffer Yb { float y[]; };
layout(std430, binding = 1) readonly buffer Bb { float b[]; };
layout(push_constant) uniform Params {
  uint n;
  uint period;
} p;

void main() {
  const uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * THREADS;
  if (i >= p.n) return;
  y[i] += b[i % p.period];
}
