// Y (T, n) = X / sqrt(mean(X^2) + eps) * W (n,), one workgroup per row.
#version 450

#define THREADS 128

layout(local_size_x = THREADS) in;
layout(std430, binding = 0) readonly buffer Xb { float x[]; };
layout(std430, binding = 1) readonly buffer Wb { float wt[]; };
layout(std430, binding = 2) writeonly buffer Yb { float y[]; };
layout(push_constant) uniform Params {
  uint T;
  uint n;
  float eps;
} p;

shared float red[THREADS];

void main() {
  const uint t = gl_WorkGroupID.x;
  const uint lid = gl_LocalInvocationID.x;
  const uint base = t * p.n;
  float ss = 0.0;
  for (uint i = lid; i < p.n; i += THREADS) ss += x[base + i] * x[base + i];
  red[lid] = ss;
  barrier();
  for (uint s = THREADS / 2; s > 0; s >>= 1) {
    if (lid < s) red[lid] += red[lid + s];
    barrier();
  }
  const float inv = inversesqrt(red[0] / float(p.n) + p.eps);
  for (uint i = lid; i < p.n; i += THREADS) y[base + i] = x[base + i] * inv * wt[i];
}
