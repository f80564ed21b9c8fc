// In place: X (T, n_head, head_dim) turned by RoPE from a host-made table CS (T, n_rot/2, 2) of (cos, sin)
// per row and pair, so the angles are the CPU forward's to the last bit. Invocation (i, h, t) turns pair
// i < n_rot/2 of head h of row t. style 0: pairs (2i, 2i+1) (llama.cpp "normal"); 1: (i, i + n_rot/2) ("NEOX").
#version 450

layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer Xb { float x[]; };
layout(std430, binding = 1) readonly buffer Cb { float cs[]; };
layout(push_constant) uniform Params {
  uint T;
  uint n_head;
  uint head_dim;
  uint n_rot;
  uint style;
} p;

void main() {
  const uint i = gl_GlobalInvocationID.x;
  const uint h = gl_GlobalInvocationID.y;
  const uint t = gl_GlobalInvocationID.z;
  const uint half_rot = p.n_rot / 2;
  if (i >= half_rot || h >= p.n_head || t >= p.T) return;
  const float c = cs[(t * half_rot + i) * 2u];
  const float s = cs[(t * half_rot + i) * 2u + 1u];
  const uint base = (t * p.n_head + h) * p.head_dim;
  const uint ia = base + (p.style == 0u ? 2u * i : i);
  const uint ib = base + (p.style == 0u ? 2u * i + 1u : i + half_rot);
  const float a = x[ia];
  const float b = x[ib];
  x[ia] = a * c - b * s;
  x[ib] = a * s + b * c;
}
